// The decoder every architecture runs (models/arch.h says what each one changes): embeddings
// (optionally scaled), then per layer
//   attention block: RMSNorm -> q/k/v (fused or not, optional bias) -> q/k head norms ->
//                    RoPE (Norm or NeoX, frequency factors, scaling) -> KV store -> attention
//                    (GQA, sliding window, soft-capping, sinks) -> output (+ bias, post-norm)
//                    -> residual
//   FFN block:       RMSNorm -> SwiGLU / GeGLU dense FFN, or routed experts (+ shared expert;
//                    router and expert biases, clamped SwiGLU for gpt-oss)
//                    -> (+ post-norm) -> residual
// then the output norm, the output projection (tied or not) and final soft-capping. A sequence
// may also ask for its tokens' hidden states after the output norm (SeqBatch::hidden).
// Granite's multipliers (ArchSpec::granite_scales) scale the embeddings, each block's output
// before its residual add, and the logits (divided). A hybrid stack (ArchSpec::hybrid_ssm2,
// Granite 4.0-H) runs the Mamba-2 mixer of models/ssm2_block.h in place of the attention block
// on its recurrent layers (RMSNorm -> mixer -> residual), each sequence's state in its KvStore
// state slot (zeroed when it starts); the K/V store holds only the attention layers' rows.
// Qwen3-Next (ArchSpec::hybrid_delta_net) runs the gated delta-net of models/delta_net_block.h
// there instead, and its attention layers gate their output per head (ArchSpec::attn_output_gate:
// attn_q gives each head's query and gate, the attention output is times sigmoid(gate)).
//
// Execution paths: the pooled path (one pool region per operation, work-claiming chunks) runs
// every architecture; on a single-thread pool it is the serial path. Small dense models without
// post-norms (Llama, Qwen2/3, Phi-3 layers) also have the phased path (forward_spmd: one pool
// region for the whole pass), chosen by timing; it gives the pooled path's bits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/huge_buffer.h"
#include "core/path_chooser.h"
#include "models/linear.h"
#include "models/lora_step.h"
#include "models/model.h"
#include "models/ffn_bundle_format.h"
#include "models/partition.h"
#include "models/registry.h"
#include "models/delta_net_block.h"
#include "models/sparse_ffn_runtime.h"
#include "models/ssm2_block.h"
#include "models/tensor_names.h"
#include "models/weight_loader.h"
#include "ops/ops.h"

namespace tern {
namespace {

struct Experts {
  Linear router;                          // ffn_gate_inp [n_embd -> n_expert] (+ bias, gpt-oss)
  std::vector<Linear> gate, up, down;     // [n_expert] views of the 3-D ffn_*_exps (+ biases, gpt-oss)
  Linear sh_gate, sh_up, sh_down;         // shared expert (Qwen2-MoE, Granite)
  const float* sh_gate_inp = nullptr;     // [n_embd] its sigmoid gate (Qwen2-MoE; Granite has none)
  bool shared = false;                    // the shared expert is present
  // Channels held here: each routed expert's (n_ff_exp) and the shared expert's (n_ff_shexp), or a
  // tensor-parallel rank's share of them (whole blocks of the down matrix's type, so per layer).
  int64_t n_ff = 0, sh_n_ff = 0;
};

struct LayerWeights {
  int64_t n_head = 0, n_head_kv = 0, n_ff = 0;
  const float* attn_norm = nullptr;       // [n_embd]
  const float* q_norm = nullptr;          // [head_dim]
  const float* k_norm = nullptr;          // [head_dim]
  const float* attn_post_norm = nullptr;  // [n_embd]
  Linear q, k, v, o;                      // [n_embd -> n_head*head_dim | n_head_kv*head_dim], o back
  const float* attn_sinks = nullptr;      // [n_head] softmax sink logits (gpt-oss)
  const float* ffn_norm = nullptr;        // [n_embd]
  const float* ffn_post_norm = nullptr;   // [n_embd]
  Linear gate, up, down;                  // dense FFN [n_embd -> n_ff], [n_ff -> n_embd]
  std::unique_ptr<Experts> moe;           // routed FFN instead of the dense one
  std::unique_ptr<Ssm2Weights> ssm;       // a hybrid's Mamba-2 layer: this mixer instead of attention
  std::unique_ptr<DeltaNetWeights> delta; // Qwen3-Next's gated delta-net layer: this instead of attention
  bool q_gated = false;                   // q holds each head's query then its output gate (2 head_dim rows)
};

// TERN_SMALL_MODEL_PATH=phased|serial forces the small-model path (tests, benchmarks); unset
// or anything else: chosen by timing.
int small_path_from_env() {
  const char* v = std::getenv("TERN_SMALL_MODEL_PATH");
  if (!v) return -1;
  const std::string s = v;
  return s == "phased" ? 1 : s == "serial" ? 0 : -1;
}

// The single-region forward path (forward_spmd) applies up to this size.
constexpr int64_t kSpmdMaxTokens = 8;
constexpr int64_t kSpmdMaxEmbd = 1024;
// The most multiply-adds per layer (a step's tokens x a token's) at which the calling thread
// alone may still beat the threads, so that the path choosers time both ways. Above it the
// threaded path runs without a trial: a step there is milliseconds of work per layer and the
// hand-offs tens of microseconds. Measured on a 2-vCPU Zen 4 (tern bench, forced paths, medians
// of 8): alone won only below ~6 M (tern-stories' 32-token prompts, 62k vs 58k tok/s); the
// threads won 1.3x at tern-stories' 128-token prompts (24 M), 1.2x at Qwen2.5-0.5B's one-token
// decode (15 M) and 1.5-1.8x at its 8- to 128-token prompts (119 M and up), where before this
// bound every new prompt length ran its first 6 steps alone while the chooser explored.
constexpr double kSerialMaxLayerMacs = 32e6;
// Steps of up to this many tokens run their experts in two pool regions per layer (experts_batched:
// a batched decode, a short prompt chunk); longer ones one expert at a time (experts_over_tokens),
// whose per-expert regions their larger token groups pay for, in buffers of T rows, not T x K.
constexpr int64_t kBatchedExpertsMaxTokens = 64;

// Epilogue context of the FFN's gate/up matmul: the activation of finished rows.
struct ActRows {
  float* gate;        // [n_tokens][ld] receives act(gate + gate_bias) * (up + up_bias)
  float* up;          // [n_tokens][ld]
  int64_t ld;
  FfnActivation act;
  const float* gate_bias = nullptr;  // [ld] or nullptr
  const float* up_bias = nullptr;
};
void act_rows_done(const void* ctx, int, int64_t n_tokens, int64_t r0, int64_t r1) {
  const ActRows& a = *static_cast<const ActRows*>(ctx);
  if (a.gate_bias) add_bias_cols(a.gate, a.ld, a.gate_bias, n_tokens, r0, r1);
  if (a.up_bias) add_bias_cols(a.up, a.ld, a.up_bias, n_tokens, r0, r1);
  if (a.act == FfnActivation::Silu) {
    swiglu_cols(a.gate, a.up, a.gate, a.ld, n_tokens, r0, r1);
    return;
  }
  const auto act = a.act == FfnActivation::GeluTanh ? geglu : a.act == FfnActivation::Relu ? reglu : swiglu_oai;
  for (int64_t t = 0; t < n_tokens; ++t) act(a.gate + t * a.ld + r0, a.up + t * a.ld + r0, a.gate + t * a.ld + r0, r1 - r0);
}

// out[c] += w * y[c] for c in [c0, c1): an expert's weighted output into a token's sum. The paths
// that must agree bit for bit (experts_over_tokens, experts_batched) sum through this one loop.
void add_weighted(float* out, const float* y, float w, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) out[c] += w * y[c];
}

// A linear's tensor-parallel share (models/partition.h): the weight's rows [row0, row0 + n_out) of
// rows_total, or with cols_total > 0 its columns [col0, col0 + n_in) of cols_total.
struct Share {
  int64_t row0 = 0, rows_total = -1;
  int64_t col0 = 0, cols_total = 0;
  bool bias = true;  // this rank adds the bias (a column-split matrix's once, on rank 0)
};

class DecoderModel final : public Model {
 public:
  DecoderModel(const ArchSpec& spec, std::shared_ptr<const GgufFile> file, ModelPartition part)
      : spec_(spec), file_(std::move(file)), part_(std::move(part)) {
    full_hp_ = read_hparams(*file_);
    activation_ = full_hp_.ffn_activation.value_or(spec_.activation);
    if (full_hp_.hybrid() && !part_.whole())
      fail(file_->path(), ": ", full_hp_.arch, " (hybrid ", full_hp_.ssm.gated_delta ? "gated delta-net" : "Mamba-2",
           " / attention) models do not run split over processes (--tp / --pp) yet");
    hp_ = partition_hparams(full_hp_, part_, file_->path());
    layer_begin_ = part_.layer_begin;
    layer_end_ = part_.layer_end < 0 ? hp_.n_layer : part_.layer_end;
    WeightLoader ld(file_);
    // A part, or a model whose FFN stays on disk: the checked pages go back (the weights it
    // keeps are copies, or read back on use), so that the load's RSS stays what it keeps.
    ld.release_checked_pages(!part_.whole() || part_.ffn_in_store);
    ld.copy_everything(part_.ffn_in_store);  // (enable_sparse_ffn then releases the whole mapping)
    bind_weights(ld);    // plans: checks every tensor, sums the interleaved bytes
    ld.start_loading();
    bind_weights(ld);    // loads: the same tensors, interleaved into one buffer
    arena_ = ld.take_arena();
    extra_ = ld.take_extra();
    if (part_.whole())
      weight_bytes_ = model_weight_bytes(*file_);  // (a predictor's and neuron bundles' tensors are not the model's)
    // Each linear's bytes for the decode's read probe, and a token's multiply-adds per layer (the
    // mean over the layers, a routed expert's counted by its share of the tokens, n_expert_used /
    // n_expert): what one thread would do alone in a step of one token (kSerialMaxLayerMacs).
    double layer_macs = 0;
    const auto stream = [&](const Linear& l, double share = 1.0) {
      if (l.present()) layer_macs += share * double(l.w.n_in) * double(l.w.n_out);
      if (l.factored()) {
        for (const WeightView* f : {&l.lr_a, &l.lr_b})
          decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(f->data), size_t(f->n_out * f->row_bytes()));
      } else if (l.present())
        decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(l.w.data), size_t(l.w.n_out * l.w.row_bytes()));
    };
    for (const LayerWeights& L : layers_) {
      for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) stream(*l);
      if (L.ssm)
        for (const Linear* l : {&L.ssm->in, &L.ssm->out}) stream(*l);
      if (L.delta)
        for (const Linear* l : {&L.delta->qkv, &L.delta->gate, &L.delta->qkvz, &L.delta->ba, &L.delta->out}) stream(*l);
      if (L.moe) {
        stream(L.moe->router);
        const double routed = L.moe->gate.empty() ? 0.0 : double(hp_.n_expert_used) / double(L.moe->gate.size());
        for (size_t e = 0; e < L.moe->gate.size(); ++e)
          for (const Linear* l : {&L.moe->gate[e], &L.moe->up[e], &L.moe->down[e]}) stream(*l, routed);
        for (const Linear* l : {&L.moe->sh_gate, &L.moe->sh_up, &L.moe->sh_down}) stream(*l);
      }
    }
    layer_macs_per_token_ = layers_.empty() ? 0.0 : layer_macs / double(layers_.size());
    if (output_.present()) stream(output_);
    if (!part_.whole()) {
      // This part's bytes: the matrices it reads, and the embedding rows it looks up.
      for (const auto& m : decode_weight_memory_) weight_bytes_ += int64_t(m.size());
      if (tok_embd_.data && output_.w.data != tok_embd_.data) weight_bytes_ += tok_embd_.n_out * tok_embd_.row_bytes();
    }
    phased_ = is_phased_capable();
    number_lora_targets();
  }

  void check_lora(const LoraAdapter& adapter) const override {
    std::vector<std::string> missing = lora_.unapplied(adapter);
    // A pipeline stage holds some layers (and the output only on the last): the pairs of the
    // others' are theirs to apply (dist/ asks every stage).
    std::erase_if(missing, [&](const std::string& name) { return !holds_tensor(name); });
    if (!missing.empty())
      fail(adapter.path(), ": adapts ", missing.front(), (missing.size() > 1 ? str_cat(" (and ", missing.size() - 1, " more)") : ""),
           ", to which tern applies no adapter (LoRA applies to attention, FFN, shared-expert, router, output and "
           "token-embedding matrices; not to the 3-D expert tensors or a tied output)");
  }

  // A hybrid's Mamba-2 layers hold a recurrent state: no key can be evicted from under it.
  bool can_evict_kv() const override { return !hp_.recurrent(); }

  void reserve(int64_t n_tokens) override {
    if (n_tokens <= max_tokens_) return;
    max_tokens_ = n_tokens;
    const auto T = size_t(n_tokens);
    const size_t E = size_t(hp_.n_embd);
    if (hp_.hybrid() && hp_.ssm.gated_delta) delta_mixer_.reserve(hp_, n_tokens);
    else if (hp_.hybrid()) ssm_mixer_.reserve(hp_, n_tokens);
    int64_t q_max = 0, kv_max = 0, ff_max = std::max(hp_.n_ff, hp_.n_ff_shexp);
    for (int64_t il = 0; il < hp_.n_layer; ++il) {
      q_max = std::max(q_max, hp_.n_embd_q(il));
      kv_max = std::max(kv_max, hp_.n_embd_kv(il));
    }
    x_.assign(T * E, 0.0f);
    xn_.assign(T * E, 0.0f);
    q_.assign(T * size_t(q_max), 0.0f);
    k_.assign(T * size_t(kv_max), 0.0f);
    v_.assign(T * size_t(kv_max), 0.0f);
    attn_.assign(T * size_t(q_max), 0.0f);
    qg_.assign(spec_.attn_output_gate ? 2 * T * size_t(q_max) : 0, 0.0f);
    attn_gate_.assign(spec_.attn_output_gate ? T * size_t(q_max) : 0, 0.0f);
    gate_.assign(T * size_t(ff_max), 0.0f);
    up_.assign(T * size_t(ff_max), 0.0f);
    positions_.assign(T, 0);
    rope_cs_.assign(T * size_t(hp_.n_rot), 0.0f);
    rope_cs_swa_.assign(has_swa_rope() ? T * size_t(hp_.n_rot) : 0, 0.0f);
    out_rows_.assign(T * E, 0.0f);
    if (hp_.n_expert > 0) {
      router_.assign(T * size_t(hp_.n_expert), 0.0f);
      moe_out_.assign(T * E, 0.0f);
      // One decode token's chosen experts side by side (n_expert_used rows), a few tokens' token
      // groups of every expert one after another (experts_batched: tokens x n_expert_used rows).
      const size_t K = size_t(hp_.n_expert_used);
      const size_t rows = std::max({T, K, std::min(T, size_t(kBatchedExpertsMaxTokens)) * K});
      moe_x_.assign(rows * E, 0.0f);
      moe_y_.assign(rows * E, 0.0f);
      moe_gate_.assign(rows * size_t(hp_.n_ff_exp), 0.0f);
      moe_up_.assign(rows * size_t(hp_.n_ff_exp), 0.0f);
      chosen_.assign(T * size_t(hp_.n_expert_used), 0);
      chosen_w_.assign(T * size_t(hp_.n_expert_used), 0.0f);
    }
  }
  int64_t max_step_tokens() const override { return max_tokens_; }

  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) override;
  void forward_stage(std::span<const SeqBatch> seqs, KvStore& kv, float* x, float* logits, ThreadPool& pool) override;
  void enable_sparse_ffn(const SparseFfnConfig& cfg) override;
  SparseFfn* sparse_ffn() override { return sparse_.get(); }

 private:
  // Binds every tensor the spec asks for (the loader checks names, shapes and types).
  void bind_weights(WeightLoader& ld);
  // Gives every linear an adapters may apply to its LoraTarget id (and token_embd one).
  void number_lora_targets();
  // Whether this part of the model holds tensor `name` (or a share of it): a pipeline stage holds
  // its layers' tensors, the last stage the output's; the token embeddings are on every part.
  bool holds_tensor(const std::string& name) const {
    if (part_.whole()) return true;
    if (name.rfind("blk.", 0) == 0) {
      const int64_t il = std::atoll(name.c_str() + 4);
      return il >= layer_begin_ && il < layer_end_;
    }
    if (name.rfind("output", 0) == 0) return part_.last_stage(hp_.n_layer);
    return true;
  }

  // This tensor-parallel rank's channels of an FFN (dense or one expert) of F_all channels whose
  // down matrix `down` is split by columns: whole blocks of its type, none of them empty.
  SplitRange channel_share(const WeightLoader& ld, const std::string& down, int64_t F_all) const {
    const int64_t unit = ld.has(down) ? ld.column_unit(down) : 1;
    if (F_all % unit != 0)
      fail(file_->path(), ": ", down, "'s ", F_all, " columns are not whole blocks of ", unit,
           ", so its FFN cannot be split for tensor parallelism");
    const SplitRange r = split_range(F_all, unit, part_.tp_rank, part_.tp_size);
    if (r.size() == 0)
      fail(file_->path(), ": --tp ", part_.tp_size, " leaves rank ", part_.tp_rank, " none of ", down, "'s ", F_all,
           " channels (blocks of ", unit, "): use a smaller --tp");
    return r;
  }

  Linear linear(WeightLoader& ld, Tensor t, int64_t il, int64_t n_in, int64_t n_out, bool bias_required,
                bool bias_optional, const Share& share = Share{}) {
    Linear l;
    l.name = tensor_name(t, il);
    if (share.rows_total >= 0 || share.cols_total > 0) {
      if (!ld.has(l.name) && ld.has(tensor_name(t, il, "lr_a.weight")))
        fail(file_->path(), ": ", l.name, " is low-rank factored (tern lowrank); tensor parallelism needs plain matrices");
      if (share.cols_total > 0) {
        l.w = ld.matmul_cols(l.name, share.cols_total, n_out, share.col0, n_in);
        l.col0 = share.col0;
      } else {
        l.w = ld.matmul(l.name, n_in, n_out, share.row0, share.rows_total);
        l.row0 = share.row0;
      }
      const std::string b = tensor_name(t, il, "bias");
      const int64_t b_len = share.rows_total >= 0 ? share.rows_total : n_out;
      const float* bias = bias_required ? ld.vector(b, b_len, "biases")
                          : bias_optional ? ld.optional_vector(b, b_len, "biases") : nullptr;
      if (bias && share.bias) l.bias = bias + share.row0;
      return l;
    }
    const std::string a = tensor_name(t, il, "lr_a.weight"), bn = tensor_name(t, il, "lr_b.weight");
    if (!ld.has(l.name) && ld.has(a)) {
      // Low-rank factored (`tern lowrank`): A [n_in -> rank], B [rank -> n_out]; the rank is A's.
      const GgufTensorInfo* ta = ld.file().find_tensor(a);
      const int64_t rank = ta->ne.size() == 2 ? ta->ne[1] : 0;
      if (rank < 1) fail(file_->path(), ": loading ", a, ": expected ", n_in, " x rank, file has ", ta->shape_string());
      if (!ld.has(bn)) fail(file_->path(), ": ", a, " has no partner ", bn);
      l.lr_a = ld.matmul(a, n_in, rank);
      l.lr_b = ld.matmul(bn, rank, n_out);
      l.w = WeightView{l.lr_b.type, n_in, n_out, nullptr};
      has_factored_ = true;
    } else {
      l.w = ld.matmul(l.name, n_in, n_out);
    }
    const std::string b = tensor_name(t, il, "bias");
    if (bias_required) l.bias = ld.vector(b, n_out, "biases");
    else if (bias_optional) l.bias = ld.optional_vector(b, n_out, "biases");
    return l;
  }
  // Whether forward_spmd implements this model's layer (dense, no post-norms, uniform layers).
  bool is_phased_capable() const;
  bool has_swa_rope() const { return hp_.rope_freq_base_swa > 0.0f && hp_.rope_freq_base_swa != hp_.rope_freq_base; }
  RopeParams rope_params(bool swa) const;
  bool rotate_keys(int64_t il, float* k, int64_t n_rows, int64_t delta) const override;

  // Positions, RoPE tables and the step's adapters; the token embeddings into x_ when `embed`.
  void prepare_step(std::span<const SeqBatch> seqs, int64_t T, bool embed);
  // forward() less the hidden states: the chosen path's layers and logits.
  void forward_logits(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool);
  void forward_layers_pooled(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, ThreadPool& pool);
  void attention_block(int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, ThreadPool& pool);
  // A hybrid's Mamba-2 layer in place of attention_block: x += mixer(rms_norm(x)) (residual-scaled);
  // Qwen3-Next's gated delta-net layer likewise.
  void ssm_block(int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, ThreadPool& pool);
  // x_ += y [T * n_embd] (y times Granite's residual_scale first, when the file has one).
  void add_residual(float* y, int64_t n);
  // A hybrid's layer il against the file: a Mamba-2 layer has no attention tensors, an
  // attention layer no ssm_* ones; throws naming the layer otherwise.
  void check_hybrid_layer(const WeightLoader& ld, int64_t il) const;
  void ffn_block(int64_t il, int64_t T, ThreadPool& pool);
  // The dense FFN of layer il over T tokens of x (rows n_embd apart): xn_ receives their
  // normalised rows, out [T, n_embd] the FFN's output (before any post-norm).
  void ffn_dense(const LayerWeights& L, const float* x, int64_t T, float* xn, float* out, ThreadPool& pool);
  // ffn_block's sparse path (sparse_step_): per token, the predictor's neurons or the dense FFN.
  void ffn_sparse(int64_t il, int64_t T, ThreadPool& pool);
  void moe_block(const LayerWeights& L, int64_t T, ThreadPool& pool);
  void moe_decode_token(const Experts& X, ThreadPool& pool);
  void experts_over_tokens(const Experts& X, int64_t T, ThreadPool& pool);
  void experts_batched(const Experts& X, int64_t T, ThreadPool& pool);
  void shared_expert(const Experts& X, int64_t T, ThreadPool& pool);
  void forward_spmd(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits, ThreadPool& pool);
  // Final norm and output projection of the rows that need logits (after forward_layers_pooled).
  void forward_output(std::span<const SeqBatch> seqs, float* logits, ThreadPool& pool);
  void forward_small_serial(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits);
  int64_t gather_output_rows(std::span<const SeqBatch> seqs, float* out) const;
  // matmul_shared_input epilogue of q/k/v (ctx = this): bias, then RoPE (Norm layout) where the
  // layer needs nothing between them (q/k head norms).
  static void qkv_rows_done(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1);

  const ArchSpec& spec_;
  // The FFN's activation: the architecture's, or the file's tern.ffn_activation (a ReLU-fied model).
  FfnActivation activation_ = FfnActivation::Silu;
  std::shared_ptr<const GgufFile> file_;
  ModelPartition part_;              // the part of the model this process holds (whole by default)
  HParams full_hp_;                  // the whole model's shape (hp_: this part's)
  int64_t layer_begin_ = 0, layer_end_ = 0;  // the layers held: [layer_begin_, layer_end_)
  HugeBuffer arena_;                 // the interleaved copies of the matmul weights
  std::vector<HugeBuffer> extra_;
  WeightView tok_embd_;
  Linear output_;                    // [n_embd -> n_vocab], or this rank's vocab_ rows of it
  SplitRange vocab_{0, 0};           // tensor parallelism: the output rows this rank computes
  std::vector<float> logits_share_;  // [rows][max share] this rank's logits, then [tp_size][rows][max share]
  const float* output_norm_ = nullptr;
  const float* rope_freqs_ = nullptr;  // [n_rot / 2] Llama 3.x frequency factors
  std::vector<LayerWeights> layers_;
  bool phased_ = false;
  bool has_factored_ = false;        // some linear is low-rank factored (lr_a / lr_b)

  int64_t max_tokens_ = 0;
  // Activation scratch, sized by reserve(); T = tokens of the step.
  std::vector<float> x_;      // [T, n_embd] residual stream
  std::vector<float> xn_;     // [T, n_embd] normalised input of a block / a block's output
  std::vector<float> q_;      // [T, n_head * head_dim]
  std::vector<float> k_;      // [T, n_head_kv * head_dim]
  std::vector<float> v_;      // [T, n_head_kv * head_dim]
  std::vector<float> attn_;   // [T, n_head * head_dim] attention output before o
  std::vector<float> qg_;     // [T, 2 n_head head_dim] attn_q's rows where it gates the output (each head's q, gate)
  std::vector<float> attn_gate_;  // [T, n_head * head_dim] those gates
  std::vector<float> gate_;   // [T, n_ff] (or the shared expert's)
  std::vector<float> up_;     // [T, n_ff]
  std::vector<int32_t> positions_;  // [T]
  std::vector<float> rope_cs_;      // [T][n_rot / 2][2] RoPE cos/sin per token (rope_table)
  std::vector<float> rope_cs_swa_;  // the same with the sliding layers' base (Gemma 3)
  std::vector<float> out_rows_;     // [rows needing logits, n_embd]
  std::vector<float> router_;       // [T, n_expert] router logits, then probabilities
  std::vector<float> moe_x_;        // [tokens routed to one expert (or to each, one after another), n_embd]
  std::vector<float> moe_gate_, moe_up_;  // [those tokens, n_ff_exp]
  std::vector<float> moe_y_;        // [those tokens, n_embd]
  std::vector<float> moe_out_;      // [T, n_embd] the experts' weighted sum
  std::vector<int32_t> chosen_;     // [T, n_expert_used] experts of each token
  std::vector<float> chosen_w_;     // [T, n_expert_used] their weights
  std::vector<MatmulTarget> moe_targets_;  // a decode token's experts' gate and up
  // experts_batched's token groups, experts in order: expert group_expert_[i] takes the gathered
  // rows [group_start_[i], group_start_[i + 1]); row r is token row_token_[r] at weight row_w_[r].
  std::vector<int32_t> group_expert_, group_start_, row_token_;
  std::vector<float> row_w_;
  std::vector<AttentionArgs> attn_args_;
  std::vector<float> key_mass_;  // one layer's key masses (H2O), see attention_block
  int64_t cur_layer_ = 0;           // the layer qkv_rows_done works for
  PhasedWork spmd_work_;               // forward_spmd's phases
  PathChooser spmd_chooser_;           // forward_spmd (1) or this thread alone (0), by timing
  PathChooser batch_chooser_;          // small models' larger steps: pooled (1) or alone (0)
  double layer_macs_per_token_ = 0;    // a token's multiply-adds in a mean layer (the constructor)
  int small_path_forced_ = small_path_from_env();  // -1: choose by timing
  ThreadPool serial_{1};               // no threads: runs on the caller
  std::vector<int32_t> phase_units_;   // units per phase of the current pass
  LoraStep lora_;                      // this step's adapters, per linear
  int32_t embd_lora_id_ = -1;          // token_embd's LoraTarget id
  LinearHooks hooks_;                  // observer_ and (when a token runs an adapter) &lora_
  Ssm2Block ssm_mixer_;                // a hybrid's Mamba-2 scratch (reserve)
  std::unique_ptr<SparseFfn> sparse_;  // --sparse-ffn: the predicted-sparse FFN (enable_sparse_ffn)
  bool sparse_step_ = false;           // this step's dense FFN layers run sparse_
  bool ffn_in_store_ = false;          // some dense FFN layers were not bound (ModelPartition::ffn_in_store)
  std::vector<float> sparse_y_;        // [n_embd] one token's FFN output on the sparse path
  DeltaNetBlock delta_mixer_;          // Qwen3-Next's gated delta-net scratch (reserve)
};

void DecoderModel::number_lora_targets() {
  std::vector<LoraTarget> targets;
  const auto add = [&](Linear& l) {
    if (!l.present()) return;
    l.lora_id = int32_t(targets.size());
    targets.push_back(LoraTarget{l.name, l.row0, l.w.n_in, l.w.n_out, l.col0});
  };
  for (LayerWeights& L : layers_) {
    for (Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) add(*l);
    if (L.moe) {
      // Routed experts are 3-D tensors (one LoRA pair per matrix, not per expert): not adapted.
      for (Linear* l : {&L.moe->router, &L.moe->sh_gate, &L.moe->sh_up, &L.moe->sh_down}) add(*l);
    }
  }
  // A tied output is token_embd itself, whose pairs have the embedding layout: not adapted.
  if (output_.name != tensor_name(Tensor::TokenEmbd)) add(output_);
  embd_lora_id_ = int32_t(targets.size());
  targets.push_back(LoraTarget{tensor_name(Tensor::TokenEmbd), 0, hp_.n_embd, hp_.n_vocab, 0});
  // The output runs over the rows that need logits, not over every token.
  lora_.set_targets(std::move(targets), output_.lora_id);
}

// Adds each token's embedding update: scale * B A[token] (llama.cpp's token_embd layout:
// A [n_vocab][rank], B [n_embd][rank]).
static void add_embedding_lora(std::span<const LoraGroup> groups, std::span<const SeqBatch> seqs, float* x, int64_t E) {
  std::vector<int32_t> ids;
  for (const auto& s : seqs) ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
  for (const LoraGroup& g : groups) {
    const LoraPair& p = *g.pair;
    for (int64_t t = g.t0; t < g.t0 + g.n; ++t) {
      const float* a = p.a.data() + int64_t(ids[size_t(t)]) * p.rank;
      float* xt = x + t * E;
      for (int64_t e = 0; e < E; ++e) {
        const float* b = p.b.data() + e * p.rank;
        float d = 0.0f;
        for (int64_t k = 0; k < p.rank; ++k) d += b[k] * a[k];
        xt[e] += g.scale * d;
      }
    }
  }
}

void DecoderModel::bind_weights(WeightLoader& ld) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab, hd = hp_.head_dim;
  const bool first = part_.first_stage(), last = part_.last_stage(hp_.n_layer);
  if (last) output_norm_ = ld.vector(tensor_name(Tensor::OutputNorm), E, "norm weights");
  const bool tied = !ld.has(tensor_name(Tensor::Output));
  if (last && part_.tp_size > 1) {
    // Tensor parallelism splits the output projection by vocabulary rows; the logits are
    // gathered (forward_output). The embedding rows are looked up from the file.
    vocab_ = split_range(V, 1, part_.tp_rank, part_.tp_size);
    const std::string n = tensor_name(tied ? Tensor::TokenEmbd : Tensor::Output);
    output_ = Linear{n, ld.matmul(n, E, vocab_.size(), vocab_.begin, V), nullptr, true, vocab_.begin};
    if (first) tok_embd_ = ld.rows(tensor_name(Tensor::TokenEmbd), E, V);
  } else if (!tied) {
    if (first) tok_embd_ = ld.rows(tensor_name(Tensor::TokenEmbd), E, V);  // rows looked up, never a matmul
    if (last) output_ = Linear{tensor_name(Tensor::Output), ld.matmul(tensor_name(Tensor::Output), E, V)};
  } else if (!last) {
    if (first) tok_embd_ = ld.rows(tensor_name(Tensor::TokenEmbd), E, V);  // (a first stage that is not the last)
  } else {
    // Tied embeddings: the output projection is a matmul like any other, so the matrix takes the
    // layout the kernels read (interleaved where they want it) and the lookup dequantizes its rows
    // from there. Left as stored, one token's logits would come from the GEMV tiles and a batch's
    // from the row-lane tiles, which round differently: a verify step's rows (speculative
    // decoding) and a prefill's would then differ from decode's in the last bits.
    tok_embd_ = ld.matmul(tensor_name(Tensor::TokenEmbd), E, V);
    output_ = Linear{tensor_name(Tensor::TokenEmbd), tok_embd_};
  }
  rope_freqs_ = ld.optional_vector(tensor_name(Tensor::RopeFreqs), hp_.n_rot / 2, "rope frequency factors");
  const bool any_bias_optional = spec_.optional_bias;
  layers_.clear();
  layers_.resize(size_t(hp_.n_layer));
  const bool split = part_.tp_size > 1;
  const int64_t tp = part_.tp_size, tpr = part_.tp_rank;
  if (split) hp_.n_ff_exp = hp_.n_ff_shexp = 0;  // the largest share of any layer's experts, set below
  for (int64_t il = layer_begin_; il < layer_end_; ++il) {
    LayerWeights& L = layers_[size_t(il)];
    L.n_head = hp_.head_count(il);
    L.n_head_kv = hp_.head_count_kv(il);
    const int64_t Eq = L.n_head * hd, Ekv = L.n_head_kv * hd;
    // The whole layer's widths; a tensor-parallel rank holds heads [tpr * n_head, ...) of them.
    const int64_t Eq_all = Eq * tp, Ekv_all = Ekv * tp;
    L.attn_norm = ld.vector(tensor_name(Tensor::AttnNorm, il), E, "norm weights");
    const bool ssm_layer = hp_.hybrid() && hp_.is_ssm_layer(il);
    if (hp_.hybrid()) check_hybrid_layer(ld, il);
    if (ssm_layer && hp_.ssm.gated_delta) {
      L.delta = std::make_unique<DeltaNetWeights>(bind_delta_net(ld, hp_, il, file_->path()));
    } else if (ssm_layer) {
      L.ssm = std::make_unique<Ssm2Weights>(bind_ssm2(ld, hp_, il, file_->path()));
    } else if (spec_.attn_output_gate) {
      // Each head's query rows then its gate rows, one matrix (split after the matmul).
      L.q = linear(ld, Tensor::AttnQ, il, E, 2 * Eq, false, false);
      L.k = linear(ld, Tensor::AttnK, il, E, Ekv, false, false);
      L.v = linear(ld, Tensor::AttnV, il, E, Ekv, false, false);
      L.q_gated = true;
    } else if (spec_.fused_qkv && ld.has(tensor_name(Tensor::AttnQkv, il))) {
      // Row ranges of one matrix: q rows, then k, then v (each its own view of the file's rows).
      const std::string n = tensor_name(Tensor::AttnQkv, il);
      const int64_t rows = Eq_all + 2 * Ekv_all;
      const int64_t q0 = tpr * Eq, k0 = Eq_all + tpr * Ekv, v0 = Eq_all + Ekv_all + tpr * Ekv;
      L.q = Linear{n, ld.matmul(n, E, Eq, q0, rows), nullptr, true, q0};
      L.k = Linear{n, ld.matmul(n, E, Ekv, k0, rows), nullptr, false, k0};
      L.v = Linear{n, ld.matmul(n, E, Ekv, v0, rows), nullptr, false, v0};
    } else if (split) {
      const bool bias_opt = any_bias_optional || spec_.fused_qkv;
      L.q = linear(ld, Tensor::AttnQ, il, E, Eq, spec_.qkv_bias, bias_opt, Share{tpr * Eq, Eq_all});
      L.k = linear(ld, Tensor::AttnK, il, E, Ekv, spec_.qkv_bias, bias_opt, Share{tpr * Ekv, Ekv_all});
      L.v = linear(ld, Tensor::AttnV, il, E, Ekv, spec_.qkv_bias, bias_opt, Share{tpr * Ekv, Ekv_all});
    } else {
      L.q = linear(ld, Tensor::AttnQ, il, E, Eq, spec_.qkv_bias, any_bias_optional || spec_.fused_qkv);
      L.k = linear(ld, Tensor::AttnK, il, E, Ekv, spec_.qkv_bias, any_bias_optional || spec_.fused_qkv);
      L.v = linear(ld, Tensor::AttnV, il, E, Ekv, spec_.qkv_bias, any_bias_optional || spec_.fused_qkv);
    }
    if (ssm_layer) {
    } else if (split)
      L.o = linear(ld, Tensor::AttnOutput, il, Eq, E, spec_.out_bias, any_bias_optional,
                   Share{0, -1, tpr * Eq, Eq_all, tpr == 0});
    else
      L.o = linear(ld, Tensor::AttnOutput, il, Eq, E, spec_.out_bias, any_bias_optional);
    if (spec_.attn_sinks)  // this rank's heads' sinks
      L.attn_sinks = ld.vector(tensor_name(Tensor::AttnSinks, il), L.n_head * tp, "attention sinks") + tpr * L.n_head;
    if (spec_.qk_norm && !ssm_layer) {
      L.q_norm = ld.vector(tensor_name(Tensor::AttnQNorm, il), hd, "norm weights");
      L.k_norm = ld.vector(tensor_name(Tensor::AttnKNorm, il), hd, "norm weights");
    }
    if (spec_.post_norms) {
      L.attn_post_norm = ld.vector(tensor_name(Tensor::AttnPostNorm, il), E, "norm weights");
      L.ffn_post_norm = ld.vector(tensor_name(Tensor::FfnPostNorm, il), E, "norm weights");
    }
    L.ffn_norm = ld.vector(tensor_name(spec_.ffn_norm, il), E, "norm weights");
    const bool routed = spec_.moe == ArchSpec::Moe::Required ||
                        (spec_.moe == ArchSpec::Moe::Optional && ld.has(tensor_name(Tensor::FfnGateInp, il)));
    // This rank's FFN channels: whole blocks of ffn_down's type (its columns are split).
    SplitRange ff{0, full_hp_.ff_length(il)};
    if (split && !routed) {
      ff = channel_share(ld, tensor_name(Tensor::FfnDown, il), full_hp_.ff_length(il));
      hp_.n_ff_per_layer[size_t(il)] = ff.size();
    }
    L.n_ff = split ? ff.size() : hp_.ff_length(il);
    if (routed) {
      if (hp_.n_expert == 0)
        fail(file_->path(), ": ", tensor_name(Tensor::FfnGateInp, il), " present but ", hp_.arch,
             ".expert_count is missing");
      auto X = std::make_unique<Experts>();
      // Tensor parallelism splits every expert as a dense FFN is split: each rank holds channels
      // [fx.begin, fx.end) of each expert (gate/up rows, down columns), the router whole (every
      // rank routes the same tokens to the same experts, from the same bits), and its experts'
      // weighted sum is a partial sum that ffn_block all-reduces.
      const int64_t NE = hp_.n_expert, F_all = full_hp_.n_ff_exp;
      const SplitRange fx = split ? channel_share(ld, tensor_name(Tensor::FfnDownExps, il), F_all) : SplitRange{0, F_all};
      const int64_t F = fx.size();
      X->n_ff = F;
      hp_.n_ff_exp = std::max(hp_.n_ff_exp, F);
      const std::string gi = tensor_name(Tensor::FfnGateInp, il);
      X->router = Linear{gi, ld.matmul(gi, E, NE),
                         spec_.expert_biases ? ld.vector(tensor_name(Tensor::FfnGateInp, il, "bias"), NE, "router biases")
                                             : nullptr};
      // gpt-oss: one bias row per expert, [n_ff_exp, n_expert] (gate, up) and [n_embd, n_expert] (down).
      const float *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;
      if (spec_.expert_biases) {
        gate_b = ld.vectors(tensor_name(Tensor::FfnGateExps, il, "bias"), F_all, NE, "expert biases");
        up_b = ld.vectors(tensor_name(Tensor::FfnUpExps, il, "bias"), F_all, NE, "expert biases");
        down_b = ld.vectors(tensor_name(Tensor::FfnDownExps, il, "bias"), E, NE, "expert biases");
        if (tpr != 0) down_b = nullptr;  // a row-split matrix's bias is added once, on rank 0
      }
      for (int64_t e = 0; e < NE; ++e) {
        // Experts are not shown to the observer: calibration of 3-D tensors is not supported.
        const std::string g = tensor_name(Tensor::FfnGateExps, il), u = tensor_name(Tensor::FfnUpExps, il),
                          d = tensor_name(Tensor::FfnDownExps, il);
        const float* gb = gate_b ? gate_b + e * F_all + fx.begin : nullptr;
        const float* ub = up_b ? up_b + e * F_all + fx.begin : nullptr;
        X->gate.push_back(Linear{g, ld.matmul(g, E, F, fx.begin, F_all, e, NE), gb, false});
        X->up.push_back(Linear{u, ld.matmul(u, E, F, fx.begin, F_all, e, NE), ub, false});
        X->down.push_back(Linear{d, split ? ld.matmul_cols(d, F_all, E, fx.begin, F, e, NE) : ld.matmul(d, F, E, 0, E, e, NE),
                                 down_b ? down_b + e * E : nullptr, false});
      }
      if (spec_.shared_expert && full_hp_.n_ff_shexp > 0) {
        const int64_t S_all = full_hp_.n_ff_shexp;
        if (split) {
          const SplitRange fs = channel_share(ld, tensor_name(Tensor::FfnDownShexp, il), S_all);
          X->sh_gate = linear(ld, Tensor::FfnGateShexp, il, E, fs.size(), false, false, Share{fs.begin, S_all});
          X->sh_up = linear(ld, Tensor::FfnUpShexp, il, E, fs.size(), false, false, Share{fs.begin, S_all});
          X->sh_down = linear(ld, Tensor::FfnDownShexp, il, fs.size(), E, false, false,
                              Share{0, -1, fs.begin, S_all, tpr == 0});
          X->sh_n_ff = fs.size();
        } else {
          X->sh_gate = linear(ld, Tensor::FfnGateShexp, il, E, S_all, false, false);
          X->sh_up = linear(ld, Tensor::FfnUpShexp, il, E, S_all, false, false);
          X->sh_down = linear(ld, Tensor::FfnDownShexp, il, S_all, E, false, false);
          X->sh_n_ff = S_all;
        }
        hp_.n_ff_shexp = std::max(hp_.n_ff_shexp, X->sh_n_ff);
        if (spec_.shared_expert_gate) {
          // [n_embd], or [n_embd, 1] as the converters write the shared_expert_gate's one row
          const std::string gs = tensor_name(Tensor::FfnGateInpShexp, il);
          const GgufTensorInfo* ti = ld.file().find_tensor(gs);
          X->sh_gate_inp = ti && ti->ne.size() == 2 ? ld.vectors(gs, E, 1, "shared expert gates")
                                                    : ld.vector(gs, E, "shared expert gates");
        }
        X->shared = true;
      }
      L.moe = std::move(X);
    } else if (spec_.fused_gate_up && !ld.has(tensor_name(Tensor::FfnGate, il))) {
      const std::string n = tensor_name(Tensor::FfnUp, il);
      const int64_t F_all = full_hp_.ff_length(il);
      L.gate = Linear{n, ld.matmul(n, E, L.n_ff, ff.begin, 2 * F_all), nullptr, true, ff.begin};
      L.up = Linear{n, ld.matmul(n, E, L.n_ff, F_all + ff.begin, 2 * F_all), nullptr, false, F_all + ff.begin};
      if (split)
        L.down = linear(ld, Tensor::FfnDown, il, L.n_ff, E, false, false, Share{0, -1, ff.begin, F_all, tpr == 0});
      else
        L.down = linear(ld, Tensor::FfnDown, il, L.n_ff, E, false, false);
    } else if (split) {
      const int64_t F_all = full_hp_.ff_length(il);
      L.gate = linear(ld, Tensor::FfnGate, il, E, L.n_ff, false, any_bias_optional, Share{ff.begin, F_all});
      L.up = linear(ld, Tensor::FfnUp, il, E, L.n_ff, false, any_bias_optional, Share{ff.begin, F_all});
      L.down = linear(ld, Tensor::FfnDown, il, L.n_ff, E, false, any_bias_optional, Share{0, -1, ff.begin, F_all, tpr == 0});
    } else if (part_.ffn_in_store && activation_ == FfnActivation::Relu && ld.has(tensor_name(Tensor::FfnGate, il)) &&
               ld.has(tensor_name(Tensor::FfnDown, il)) && !ld.has(tensor_name(Tensor::FfnGate, il, "bias")) &&
               !ld.has(tensor_name(Tensor::FfnUp, il, "bias")) && !ld.has(tensor_name(Tensor::FfnDown, il, "bias"))) {
      // --ram-budget: the neuron store reads these rows from the file's bundles (enable_sparse_ffn
      // checks the tensors); nothing of them is read now.
      ffn_in_store_ = true;
    } else {
      L.gate = linear(ld, Tensor::FfnGate, il, E, L.n_ff, false, any_bias_optional);
      L.up = linear(ld, Tensor::FfnUp, il, E, L.n_ff, false, any_bias_optional);
      L.down = linear(ld, Tensor::FfnDown, il, L.n_ff, E, false, any_bias_optional);
    }
  }
  if (split) hp_.n_ff = *std::max_element(hp_.n_ff_per_layer.begin(), hp_.n_ff_per_layer.end());
}

bool DecoderModel::is_phased_capable() const {
  // forward_spmd splits every block into row units; a post-norm needs a whole row of a block's
  // output before the residual (one more phase), and experts are chosen per token: those
  // architectures take the pooled path in its place.
  // Its row units read one matrix per linear: low-rank factored linears take the pooled path.
  // A part of a model (dist/) sums partial results between the phases: the pooled path.
  // Granite's multipliers and a hybrid's Mamba-2 layers: the pooled path too.
  return !spec_.post_norms && hp_.n_expert == 0 && hp_.uniform_layers() && !has_factored_ && part_.whole() &&
         !spec_.granite_scales && !hp_.hybrid();
}

bool DecoderModel::rotate_keys(int64_t il, float* k, int64_t n_rows, int64_t delta) const {
  const bool swa = hp_.is_swa(il) && has_swa_rope();
  RopeParams p = rope_params(swa);
  if (p.n_rot == 0 || p.ext_factor != 0.0f) return false;
  p.attn_factor = 1.0f;
  const int32_t pos = int32_t(delta);
  std::vector<float> cs(size_t(p.n_rot));  // one position's [n_rot / 2][cos, sin]
  rope_table_ext(&pos, 1, p, cs.data());
  const int64_t Ekv = hp_.n_embd_kv(il), hd = hp_.head_dim;
  for (int64_t r = 0; r < n_rows; ++r) {
    if (hp_.rope_layout == RopeLayout::Neox) rope_neox_table(k + r * Ekv, Ekv, cs.data(), 1, Ekv / hd, hd, hp_.n_rot);
    else rope_cols_table(k + r * Ekv, Ekv, cs.data(), 1, hd, hp_.n_rot, 0, Ekv);
  }
  return true;
}

RopeParams DecoderModel::rope_params(bool swa) const {
  RopeParams p;
  p.n_rot = hp_.n_rot;
  p.freq_base = swa && hp_.rope_freq_base_swa > 0.0f ? hp_.rope_freq_base_swa : hp_.rope_freq_base;
  p.freq_factors = rope_freqs_;
  // Gemma 3's sliding layers rotate unscaled; the global ones (and every other model's) take
  // the file's scaling.
  const bool scaled = !(swa && hp_.rope_freq_base_swa > 0.0f);
  if (scaled && hp_.rope_scaling.kind != RopeScaling::Kind::None) {
    p.freq_scale = 1.0f / hp_.rope_scaling.factor;
    p.ext_factor = hp_.rope_scaling.ext_factor;
    p.attn_factor = hp_.rope_scaling.attn_factor;
    p.beta_fast = hp_.rope_scaling.beta_fast;
    p.beta_slow = hp_.rope_scaling.beta_slow;
    p.n_ctx_orig = hp_.rope_scaling.n_ctx_orig;
  }
  return p;
}

void DecoderModel::forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
  forward_logits(seqs, kv, logits, pool);
  // Every path leaves the last layer's residual stream in x_ ([T, n_embd]): the hidden states
  // asked for are its rows through the output norm (the same rms_norm_row as the logits' rows,
  // so logits = hidden x output^T on every path).
  const int64_t E = hp_.n_embd;
  int64_t t = 0;
  for (const auto& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    if (s.hidden && n > 0) rms_norm(x_.data() + t * E, output_norm_, s.hidden, n, E, hp_.rms_eps, serial_);
    t += n;
  }
}

void DecoderModel::forward_logits(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
  TERN_ASSERT_MSG(part_.first_stage() && part_.last_stage(hp_.n_layer), "a pipeline stage runs forward_stage()");
  const int64_t E = hp_.n_embd;
  int64_t T = 0;
  for (const auto& s : seqs) {
    TERN_ASSERT(int64_t(s.slots.size()) >= s.n_past + int64_t(s.tokens.size()));
    // Sliding-window layers measure a key's distance by its index in `slots`, which is its
    // position only when nothing was evicted (the cache policies refuse such models first).
    TERN_ASSERT_MSG(s.pos < 0 || s.pos == s.n_past || hp_.n_swa == 0, "evicted keys with sliding-window layers");
    TERN_ASSERT(s.pos < 0 || s.pos >= s.n_past);
    if (hp_.hybrid()) {
      TERN_ASSERT_MSG(s.state_slot >= 0 && s.state_slot < kv.n_state_slots(), "a recurrent model needs a state slot");
      TERN_ASSERT_MSG(s.pos < 0 || s.pos == s.n_past, "a recurrent state cannot skip positions");
    }
    T += int64_t(s.tokens.size());
  }
  if (T == 0) return;
  TERN_ASSERT_MSG(T <= max_tokens_, "step larger than reserve()");
  if (hp_.hybrid())
    for (const auto& s : seqs)
      if (s.n_past == 0 && !s.tokens.empty()) kv.clear_state(s.state_slot);  // a sequence starts from zero

  prepare_step(seqs, T, /*embed=*/true);
  // The sparse FFN runs token by token inside the pooled path's ffn_block; adapters and
  // observers see the dense layers.
  sparse_step_ = sparse_ && sparse_->step_applies(T) && !hooks_.lora && !observer_;
  if (ffn_in_store_ && !sparse_step_)
    fail(file_->path(), ": --ram-budget: ",
         !sparse_ ? "the sparse FFN was not enabled after the load"
                  : hooks_.lora ? "LoRA adapters apply to the dense FFN" : "an observer of the layers' inputs needs the dense FFN",
         ", whose weights are not in memory");
  if (sparse_step_) {
    forward_layers_pooled(seqs, kv, T, pool);
    forward_output(seqs, logits, pool);
    return;
  }

  // Small models decoding a few tokens: each operation is a microsecond or less, so one pool
  // region per operation (11 per layer) costs more than the work. They run either as one region
  // for the whole pass in phases (forward_spmd) or on this thread alone; which is faster depends
  // on how fast the cores hand work to each other (on a VM: where the host puts the vCPUs), so
  // both are timed and the faster is used (PathChooser; TERN_SMALL_MODEL_PATH=phased|serial
  // forces one). Bigger steps and models keep the pooled path, whose work-claiming chunks
  // tolerate a descheduled thread. All three give the same bits.
  // The step's size for the choosers: the positions it attends to (a long context's attention
  // pays for the threads' hand-offs where a short one's does not).
  int64_t attended = 0;
  for (const auto& s : seqs) attended += s.n_past + int64_t(s.tokens.size());
  const auto seconds_per_token = [&](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(T);
  };
  // The phased units attend without key masses (H2O sums take the other paths).
  bool phased_kv = true;
  for (const auto& s : seqs) phased_kv = phased_kv && !s.key_mass;
  // Nor a kivi2 cache: its units would store columns of one group's slots from several threads.
  phased_kv = phased_kv && kv.type() != KvType::Kivi2;
  // Timed by a chooser only where the calling thread alone may win; otherwise the threads run
  // and the chooser only notes it (its next step may start cold).
  const bool timed = small_path_forced_ < 0 && double(T) * layer_macs_per_token_ <= kSerialMaxLayerMacs;
  const auto done = [&](PathChooser& c, int path, std::chrono::steady_clock::time_point t0) {
    if (timed) c.record(path, seconds_per_token(t0));
    else c.note(path);
  };
  if (pool.size() > 1 && !observer_ && T <= kSpmdMaxTokens && E <= kSpmdMaxEmbd) {
    const int path = small_path_forced_ >= 0 ? small_path_forced_ : timed ? spmd_chooser_.pick(attended) : 1;
    const auto t0 = std::chrono::steady_clock::now();
    if (path == 1 && phased_ && phased_kv && !hooks_.lora) {  // (the phased units have no LoRA epilogue)
      forward_spmd(seqs, kv, T, logits, pool);
      done(spmd_chooser_, 1, t0);
      return;
    }
    if (path == 1) {  // post-norms or experts: the pooled path stands in for the phased one
      forward_layers_pooled(seqs, kv, T, pool);
      forward_output(seqs, logits, pool);
      done(spmd_chooser_, 1, t0);
      return;
    }
    forward_small_serial(seqs, kv, T, logits);
    done(spmd_chooser_, 0, t0);
    return;
  }
  // Their larger steps (prefill): the pooled path, or this thread alone when that is faster (a
  // 32-token stories260K prefill measured 12-80k tok/s pooled on 2 threads against ~75k alone,
  // depending on the host's vCPU placement); timed the same way (1 = pooled, 0 = alone).
  if (pool.size() > 1 && !observer_ && E <= kSpmdMaxEmbd) {
    const int path = small_path_forced_ >= 0 ? small_path_forced_ : timed ? batch_chooser_.pick(attended) : 1;
    const auto t0 = std::chrono::steady_clock::now();
    if (path == 0) {
      forward_small_serial(seqs, kv, T, logits);
      done(batch_chooser_, 0, t0);
      return;
    }
    forward_layers_pooled(seqs, kv, T, pool);
    forward_output(seqs, logits, pool);
    done(batch_chooser_, 1, t0);
    return;
  }
  forward_layers_pooled(seqs, kv, T, pool);
  forward_output(seqs, logits, pool);
}

void DecoderModel::prepare_step(std::span<const SeqBatch> seqs, int64_t T, bool embed) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  int64_t t = 0;
  for (const auto& s : seqs)
    for (size_t i = 0; i < s.tokens.size(); ++i, ++t) {
      const int32_t id = s.tokens[i];
      TERN_ASSERT_MSG(id >= 0 && id < V, "token id out of range");
      if (embed) dequantize_row(tok_embd_, id, x_.data() + t * E);
      positions_[size_t(t)] = int32_t(s.first_pos() + int64_t(i));
    }
  // The step's adapters; a token_embd update goes into the looked-up rows before Gemma's
  // scaling (as llama.cpp adds it, so a merged embedding matrix gives the same rows).
  const bool adapted = lora_.begin(seqs);
  hooks_ = LinearHooks{observer_, adapted ? &lora_ : nullptr};
  if (embed && adapted) add_embedding_lora(lora_.groups(embd_lora_id_), seqs, x_.data(), E);
  if (embed && hp_.embd_scale != 0.0f)
    for (int64_t i = 0; i < T * E; ++i) x_[size_t(i)] *= hp_.embd_scale;
  // The rotations depend on the position only: tabulated once, not per head and layer.
  rope_table_ext(positions_.data(), T, rope_params(false), rope_cs_.data());
  if (has_swa_rope()) rope_table_ext(positions_.data(), T, rope_params(true), rope_cs_swa_.data());
}

void DecoderModel::forward_stage(std::span<const SeqBatch> seqs, KvStore& kv, float* x, float* logits,
                                 ThreadPool& pool) {
  const int64_t E = hp_.n_embd;
  int64_t T = 0;
  for (const auto& s : seqs) T += int64_t(s.tokens.size());
  if (T == 0) return;
  TERN_ASSERT_MSG(T <= max_tokens_, "step larger than reserve()");
  sparse_step_ = false;  // (a model split into parts refuses --sparse-ffn)
  const bool first = part_.first_stage(), last = part_.last_stage(hp_.n_layer);
  prepare_step(seqs, T, first);
  if (!first) std::copy_n(x, T * E, x_.data());
  forward_layers_pooled(seqs, kv, T, pool);
  if (last) forward_output(seqs, logits, pool);
  else std::copy_n(x_.data(), T * E, x);
}

void DecoderModel::forward_output(std::span<const SeqBatch> seqs, float* logits, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  // Final norm and output projection only for the rows that need logits.
  const int64_t rows = gather_output_rows(seqs, out_rows_.data());
  rms_norm(out_rows_.data(), output_norm_, out_rows_.data(), rows, E, hp_.rms_eps, pool);
  if (part_.tp_size > 1) {
    // Each rank's vocabulary share, gathered: rank r's columns [v0_r, v1_r) of every row.
    const int tp = part_.tp_size;
    const int64_t share = split_range(V, 1, 0, tp).size();  // the largest share (rank 0's)
    logits_share_.resize(size_t(rows * share) * size_t(tp + 1));
    float* mine = logits_share_.data();
    float* all = mine + rows * share;
    apply_linear(output_, out_rows_.data(), E, rows, mine, share, pool, hooks_);
    part_.all_gather(mine, rows * share, all);
    for (int r = 0; r < tp; ++r) {
      const SplitRange vr = split_range(V, 1, r, tp);
      for (int64_t i = 0; i < rows; ++i)
        std::copy_n(all + (r * rows + i) * share, vr.size(), logits + i * V + vr.begin);
    }
  } else {
    apply_linear(output_, out_rows_.data(), E, rows, logits, V, pool, hooks_);
  }
  if (hp_.final_softcap > 0.0f) softcap_inplace(logits, rows * V, hp_.final_softcap);
  if (hp_.logit_scale != 0.0f) {  // (times the reciprocal, as llama.cpp scales them)
    const float inv = 1.0f / hp_.logit_scale;
    for (int64_t i = 0; i < rows * V; ++i) logits[i] *= inv;
  }
}

void DecoderModel::qkv_rows_done(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1) {
  auto* m = static_cast<DecoderModel*>(const_cast<void*>(ctx));
  const HParams& hp = m->hp_;
  const LayerWeights& L = m->layers_[size_t(m->cur_layer_)];
  const Linear& l = target == 0 ? L.q : target == 1 ? L.k : L.v;
  float* y = target == 0 ? (L.q_gated ? m->qg_.data() : m->q_.data()) : target == 1 ? m->k_.data() : m->v_.data();
  const int64_t ld = l.w.n_out;
  if (l.bias) add_bias_cols(y, ld, l.bias, n_tokens, r0, r1);
  if (target < 2 && hp.rope_layout == RopeLayout::Norm && !L.q_norm && !L.q_gated) {
    const float* cs = hp.is_swa(m->cur_layer_) && m->has_swa_rope() ? m->rope_cs_swa_.data() : m->rope_cs_.data();
    rope_cols_table(y, ld, cs, n_tokens, hp.head_dim, hp.n_rot, r0, r1);
  }
}

void DecoderModel::forward_small_serial(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits) {
  forward_layers_pooled(seqs, kv, T, serial_);
  forward_output(seqs, logits, serial_);
}

int64_t DecoderModel::gather_output_rows(std::span<const SeqBatch> seqs, float* out) const {
  const int64_t E = hp_.n_embd;
  int64_t rows = 0, t = 0;
  for (const auto& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    if (s.all_logits) {
      std::copy_n(x_.data() + t * E, n * E, out + rows * E);
      rows += n;
    } else {
      std::copy_n(x_.data() + (t + n - 1) * E, E, out + rows * E);
      rows += 1;
    }
    t += n;
  }
  return rows;
}

void DecoderModel::forward_layers_pooled(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, ThreadPool& pool) {
  for (int64_t il = layer_begin_; il < layer_end_; ++il) {
    if (layers_[size_t(il)].ssm || layers_[size_t(il)].delta) ssm_block(il, seqs, kv, T, pool);
    else attention_block(il, seqs, kv, T, pool);
    ffn_block(il, T, pool);
  }
}

void DecoderModel::ssm_block(int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, ThreadPool& pool) {
  const LayerWeights& L = layers_[size_t(il)];
  const int64_t E = hp_.n_embd;
  rms_norm(x_.data(), L.attn_norm, xn_.data(), T, E, hp_.rms_eps, pool);
  if (L.delta) delta_mixer_.run(*L.delta, hp_, il, seqs, kv, xn_.data(), xn_.data(), T, pool, hooks_);
  else ssm_mixer_.run(*L.ssm, hp_, il, seqs, kv, xn_.data(), xn_.data(), T, pool, hooks_);
  add_residual(xn_.data(), T * E);
}

void DecoderModel::add_residual(float* y, int64_t n) {
  if (hp_.residual_scale != 0.0f)
    for (int64_t i = 0; i < n; ++i) y[i] *= hp_.residual_scale;
  add_inplace(x_.data(), y, n);
}

void DecoderModel::check_hybrid_layer(const WeightLoader& ld, int64_t il) const {
  const bool ssm = hp_.is_ssm_layer(il);
  if (hp_.ssm.gated_delta) {
    // Qwen3-Next: attn_qkv is a gated delta-net tensor there (the attention layers have attn_q/k/v).
    const std::string a = hp_.arch + ".";
    const std::string why = file_->find(a + "attention.recurrent_layers")
                                ? str_cat(a, "attention.recurrent_layers[", il, "] = ", ssm ? "true" : "false")
                                : str_cat(a, "full_attention_interval ", file_->get_uint(a + "full_attention_interval", 4));
    const std::string kind = ssm ? "a gated delta-net layer" : "an attention layer";
    const Tensor attn[] = {Tensor::AttnQ, Tensor::AttnK, Tensor::AttnV, Tensor::AttnOutput};
    const Tensor delta[] = {Tensor::AttnQkv, Tensor::AttnGate, Tensor::SsmIn, Tensor::SsmBetaAlpha, Tensor::SsmOut};
    for (Tensor t : ssm ? std::span<const Tensor>(attn) : std::span<const Tensor>(delta)) {
      const std::string n = tensor_name(t, il);
      if (ld.has(n))
        fail(file_->path(), ": layer ", il, " is ", kind, " (", why, ") but the file has ", n,
             ssm ? ", an attention tensor" : ", a gated delta-net tensor", ": the layer pattern disagrees with the tensors");
    }
    for (Tensor t : ssm ? std::span<const Tensor>(delta).subspan(3) : std::span<const Tensor>(attn)) {
      const std::string n = tensor_name(t, il);
      if (!ld.has(n))
        fail(file_->path(), ": layer ", il, " is ", kind, " (", why, ") but the file has no ", n,
             ": the layer pattern disagrees with the tensors");
    }
    return;
  }
  const Tensor attn[] = {Tensor::AttnQ, Tensor::AttnK, Tensor::AttnV, Tensor::AttnQkv, Tensor::AttnOutput};
  const Tensor mamba[] = {Tensor::SsmIn, Tensor::SsmOut};
  for (Tensor t : ssm ? std::span<const Tensor>(attn) : std::span<const Tensor>(mamba)) {
    const std::string n = tensor_name(t, il);
    if (ld.has(n))
      fail(file_->path(), ": layer ", il, " is ", ssm ? "a Mamba-2 layer" : "an attention layer", " (", hp_.arch,
           ".attention.head_count_kv[", il, "] = ", hp_.head_count_kv(il), ") but the file has ", n,
           ssm ? ", an attention tensor" : ", a Mamba-2 tensor", ": the layer pattern disagrees with the tensors");
  }
}

void DecoderModel::attention_block(int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                                   ThreadPool& pool) {
  const LayerWeights& L = layers_[size_t(il)];
  const int64_t E = hp_.n_embd, hd = hp_.head_dim;
  const int64_t Eq = L.n_head * hd, Ekv = L.n_head_kv * hd;
  // q, k and v from one quantized copy of xn = rms_norm(x) in one pool region: each row is
  // normalised (into xn_) right before it is quantized; biases and (Norm-layout) RoPE are applied
  // to each chunk of rows as it is produced.
  cur_layer_ = il;
  const Linear* qkv[] = {&L.q, &L.k, &L.v};
  float* const ys[] = {L.q_gated ? qg_.data() : q_.data(), k_.data(), v_.data()};
  const int64_t lds[] = {L.q_gated ? 2 * Eq : Eq, Ekv, Ekv};
  apply_linears_shared(qkv, ys, lds, x_.data(), E, T, pool, RowsDone{qkv_rows_done, this, false},
                       InputRmsNorm{L.attn_norm, hp_.rms_eps, xn_.data()}, hooks_);
  if (L.q_gated)  // each head's query, then its output gate
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < L.n_head; ++h) {
        const float* src = qg_.data() + t * 2 * Eq + h * 2 * hd;
        std::copy_n(src, hd, q_.data() + t * Eq + h * hd);
        std::copy_n(src + hd, hd, attn_gate_.data() + t * Eq + h * hd);
      }
  // What the epilogue could not do: q/k head norms before RoPE, and the NeoX layout (its pairs
  // span a head, not a chunk's rows).
  if (L.q_norm) {
    rms_norm_heads(q_.data(), Eq, L.q_norm, T, L.n_head, hd, hp_.rms_eps);
    rms_norm_heads(k_.data(), Ekv, L.k_norm, T, L.n_head_kv, hd, hp_.rms_eps);
  }
  const float* cs = hp_.is_swa(il) && has_swa_rope() ? rope_cs_swa_.data() : rope_cs_.data();
  if (hp_.rope_layout == RopeLayout::Neox) {
    rope_neox_table(q_.data(), Eq, cs, T, L.n_head, hd, hp_.n_rot);
    rope_neox_table(k_.data(), Ekv, cs, T, L.n_head_kv, hd, hp_.n_rot);
  } else if (L.q_norm) {
    rope_cols_table(q_.data(), Eq, cs, T, hd, hp_.n_rot, 0, Eq);
    rope_cols_table(k_.data(), Ekv, cs, T, hd, hp_.n_rot, 0, Ekv);
  }

  // Store the new K/V at their slots (converted to the store's type), then attend per sequence.
  const void* kc = kv.k(il);
  const void* vc = kv.v(il);
  const float scale = hp_.attn_scale != 0.0f ? hp_.attn_scale : 1.0f / std::sqrt(float(hd));
  const int64_t window = hp_.is_swa(il) ? hp_.n_swa : 0;
  attn_args_.clear();
  // H2O: each sequence's per-KV-head key masses of this layer, [n_head_kv][n_past + n] at
  // key_mass_offset; summed into SeqBatch::key_mass below.
  size_t mass_floats = 0;
  for (const auto& s : seqs)
    if (s.key_mass) mass_floats += size_t(L.n_head_kv * (s.n_past + int64_t(s.tokens.size())));
  key_mass_.assign(mass_floats, 0.0f);
  size_t mass_at = 0;
  int64_t t = 0;
  for (const auto& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = s.slots[size_t(s.n_past + i)];
      kv.store(il, slot, 0, k_.data() + (t + i) * Ekv, v_.data() + (t + i) * Ekv, Ekv);
    }
    AttentionArgs a{q_.data() + t * Eq, Eq, attn_.data() + t * Eq, Eq, kc, vc, kv.row(il), s.slots.data(), s.n_past, n,
                    L.n_head, L.n_head_kv, hd, scale, kv.type()};
    a.softcap = hp_.attn_softcap;
    a.window = window;
    a.sinks = L.attn_sinks;
    if (s.key_mass) {
      a.key_mass = key_mass_.data() + mass_at;
      a.ld_key_mass = s.n_past + n;
      mass_at += size_t(L.n_head_kv * (s.n_past + n));
    }
    attn_args_.push_back(a);
    t += n;
  }
  attention(attn_args_, pool);
  kv.seal_due(il);  // kivi2: the groups this step completed (KvStore::seal_due)
  for (const AttentionArgs& a : attn_args_)
    if (a.key_mass) {
      float* dst = seqs[size_t(&a - attn_args_.data())].key_mass;
      for (int64_t kvh = 0; kvh < a.n_head_kv; ++kvh)
        for (int64_t j = 0; j < a.ld_key_mass; ++j) dst[j] += a.key_mass[kvh * a.ld_key_mass + j];
    }
  if (L.q_gated)  // attention output times sigmoid(gate), per head and channel
    for (int64_t i = 0; i < T * Eq; ++i) attn_[size_t(i)] *= 1.0f / (1.0f + std::exp(-attn_gate_[size_t(i)]));
  apply_linear(L.o, attn_.data(), Eq, T, xn_.data(), E, pool, hooks_);
  if (part_.tp_size > 1) part_.all_reduce(xn_.data(), T * E);  // the heads' partial sums
  if (L.attn_post_norm) rms_norm(xn_.data(), L.attn_post_norm, xn_.data(), T, E, hp_.rms_eps, pool);
  add_residual(xn_.data(), T * E);
}

void DecoderModel::ffn_block(int64_t il, int64_t T, ThreadPool& pool) {
  const LayerWeights& L = layers_[size_t(il)];
  const int64_t E = hp_.n_embd;
  if (L.moe) {
    rms_norm(x_.data(), L.ffn_norm, xn_.data(), T, E, hp_.rms_eps, pool);
    moe_block(L, T, pool);
    if (part_.tp_size > 1) part_.all_reduce(moe_out_.data(), T * E);  // the experts' channels' partial sums
    add_residual(moe_out_.data(), T * E);
    return;
  }
  if (sparse_ && sparse_->has_layer(il)) {
    // Timed (a clock read per layer) for tern bench's FFN-time comparison.
    const auto t0 = std::chrono::steady_clock::now();
    if (sparse_step_) {
      ffn_sparse(il, T, pool);
    } else {
      sparse_->count_dense_visits(T);
      ffn_dense(L, x_.data(), T, xn_.data(), xn_.data(), pool);
      if (L.ffn_post_norm) rms_norm(xn_.data(), L.ffn_post_norm, xn_.data(), T, E, hp_.rms_eps, pool);
      add_residual(xn_.data(), T * E);
    }
    sparse_->add_ffn_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return;
  }
  ffn_dense(L, x_.data(), T, xn_.data(), xn_.data(), pool);
  if (part_.tp_size > 1) part_.all_reduce(xn_.data(), T * E);  // the channels' partial sums
  if (L.ffn_post_norm) rms_norm(xn_.data(), L.ffn_post_norm, xn_.data(), T, E, hp_.rms_eps, pool);
  add_residual(xn_.data(), T * E);
}

void DecoderModel::ffn_dense(const LayerWeights& L, const float* x, int64_t T, float* xn, float* out, ThreadPool& pool) {
  // gate and up of xn = rms_norm(x) (normalised as it is quantized, as above), chunk by
  // chunk, each chunk's activation right after (into gate_).
  const int64_t E = hp_.n_embd, F = L.n_ff;
  const ActRows act{gate_.data(), up_.data(), F, activation_, L.gate.bias, L.up.bias};
  const Linear* gu[] = {&L.gate, &L.up};
  float* const ys[] = {gate_.data(), up_.data()};
  const int64_t lds[] = {F, F};
  apply_linears_shared(gu, ys, lds, x, E, T, pool, RowsDone{act_rows_done, &act, true},
                       InputRmsNorm{L.ffn_norm, hp_.rms_eps, xn}, hooks_);
  apply_linear(L.down, gate_.data(), F, T, out, E, pool, hooks_);
}

void DecoderModel::ffn_sparse(int64_t il, int64_t T, ThreadPool& pool) {
  const LayerWeights& L = layers_[size_t(il)];
  const int64_t E = hp_.n_embd;
  rms_norm(x_.data(), L.ffn_norm, xn_.data(), T, E, hp_.rms_eps, pool);
  for (int64_t t = 0; t < T; ++t) {
    float* xn_t = xn_.data() + t * E;
    // Too many neurons selected: this token's FFN runs dense (its norm again: the same row).
    if (!sparse_->run(il, xn_t, sparse_y_.data(), pool))
      ffn_dense(L, x_.data() + t * E, 1, xn_t, sparse_y_.data(), pool);
    std::copy_n(sparse_y_.data(), E, xn_t);
  }
  if (L.ffn_post_norm) rms_norm(xn_.data(), L.ffn_post_norm, xn_.data(), T, E, hp_.rms_eps, pool);
  add_residual(xn_.data(), T * E);
}

void DecoderModel::enable_sparse_ffn(const SparseFfnConfig& cfg) {
  const std::string& path = file_->path();
  if (activation_ != FfnActivation::Relu)
    fail(path, ": --sparse-ffn needs a ReLU-fied model (tern.ffn_activation \"relu\", from tern sparsify --relufy): "
         "this model's FFN is ", activation_ == FfnActivation::Silu ? "SwiGLU" : "not ReGLU",
         ", whose neurons are never exactly zero");
  if (!part_.whole()) fail(path, ": --sparse-ffn does not run split over processes (--tp / --pp) yet");
  if (ffn_in_store_ && cfg.ram_budget <= 0)
    fail(path, ": the model was loaded with its FFN weights left in the file (--ram-budget), and the sparse FFN was "
         "enabled without a budget");
  std::vector<int64_t> src;
  for (int64_t il = layer_begin_; il < layer_end_; ++il) {
    const LayerWeights& L = layers_[size_t(il)];
    if (L.moe || L.n_ff == 0) continue;
    if (L.gate.factored() || L.up.factored() || L.down.factored())
      fail(path, ": --sparse-ffn: layer ", il, "'s FFN is low-rank factored (tern lowrank); the sparse FFN reads "
           "plain matrices");
    if (L.gate.bias || L.up.bias || L.down.bias)
      fail(path, ": --sparse-ffn: layer ", il, "'s FFN has biases, which the sparse FFN does not add");
    if (L.gate.row0 != 0 || L.up.row0 != 0 || !file_->find_tensor(tensor_name(Tensor::FfnGate, il)))
      fail(path, ": --sparse-ffn: layer ", il, "'s gate and up are one fused tensor (", tensor_name(Tensor::FfnUp, il),
           "); the sparse FFN reads separate ffn_gate and ffn_up rows");
    src.push_back(il);
  }
  if (src.empty()) fail(path, ": --sparse-ffn: the model has no dense FFN layer (its FFNs are experts)");
  sparse_ = std::make_unique<SparseFfn>(file_, cfg, src);
  sparse_y_.assign(size_t(hp_.n_embd), 0.0f);
}

// Routed experts over xn_ (normalised): the router's probabilities (softmax or sigmoid), each
// token's top n_expert_used (ties to the lower index), their weights (renormalised to sum 1
// where the architecture does); then each expert runs once over the tokens routed to it, so a
// decode step reads only the chosen experts' bytes. Qwen2-MoE adds a shared expert scaled by
// sigmoid(xn . gate). Result in moe_out_.
void DecoderModel::moe_block(const LayerWeights& L, int64_t T, ThreadPool& pool) {
  const Experts& X = *L.moe;
  const int64_t E = hp_.n_embd, NE = hp_.n_expert, K = hp_.n_expert_used;
  apply_linear(X.router, xn_.data(), E, T, router_.data(), NE, pool, hooks_);
  std::vector<int32_t> order(static_cast<size_t>(NE));
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
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    if (hp_.expert_gating == ExpertGating::SoftmaxWeight) {
      // The chosen logits' softmax, in place of their logits (the others are not used).
      const float mx = p[order[0]];
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) sum += (p[order[size_t(j)]] = std::exp(p[order[size_t(j)]] - mx));
      for (int64_t j = 0; j < K; ++j) p[order[size_t(j)]] /= sum;
    }
    float wsum = 0.0f;
    for (int64_t j = 0; j < K; ++j) wsum += p[order[size_t(j)]];
    for (int64_t j = 0; j < K; ++j) {
      chosen_[size_t(t * K + j)] = order[size_t(j)];
      chosen_w_[size_t(t * K + j)] = hp_.expert_norm_topk ? p[order[size_t(j)]] / wsum : p[order[size_t(j)]];
    }
  }
  std::fill(moe_out_.begin(), moe_out_.begin() + T * E, 0.0f);
  if (T == 1 && !observer_ && K <= 64) {  // (no model uses more than 64 experts per token)
    moe_decode_token(X, pool);
  } else if (!observer_ && T <= kBatchedExpertsMaxTokens) {  // (an observer sees each expert's matmul)
    experts_batched(X, T, pool);
  } else {
    experts_over_tokens(X, T, pool);
  }
  if (X.shared) shared_expert(X, T, pool);
}

// A step's tokens grouped by expert: each routed expert runs once over its tokens.
void DecoderModel::experts_over_tokens(const Experts& X, int64_t T, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, NE = hp_.n_expert, K = hp_.n_expert_used, F = X.n_ff;
  std::vector<int32_t> rows;   // tokens routed to the expert
  std::vector<float> weights;  // and their weights
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
    const ActRows act{moe_gate_.data(), moe_up_.data(), F, activation_, X.gate[size_t(e)].bias, X.up[size_t(e)].bias};
    const Linear* gu[] = {&X.gate[size_t(e)], &X.up[size_t(e)]};
    float* const ys[] = {moe_gate_.data(), moe_up_.data()};
    const int64_t lds[] = {F, F};
    apply_linears_shared(gu, ys, lds, moe_x_.data(), E, n, pool, RowsDone{act_rows_done, &act, true}, InputRmsNorm{},
                         hooks_);
    apply_linear(X.down[size_t(e)], moe_gate_.data(), F, n, moe_y_.data(), E, pool, hooks_);
    for (int64_t r = 0; r < n; ++r)
      add_weighted(moe_out_.data() + rows[size_t(r)] * E, moe_y_.data() + r * E, weights[size_t(r)], 0, E);
  }
}

// A few tokens (a batched decode step, a short prompt chunk): the token groups of
// experts_over_tokens (each routed expert over the tokens routed to it, one matmul), but every
// expert's gate/up in one pool region and every down in a second, instead of two regions per
// expert (with 16 tokens of 8 experts each out of 64, about 56 experts run per layer). A chunk is
// a block of one expert's rows over its tokens (rows from multiples of 16, so each equals the
// pooled matmul's bit for bit), and each token's outputs are summed in expert order: the same
// bits as experts_over_tokens.
void DecoderModel::experts_batched(const Experts& X, int64_t T, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, NE = hp_.n_expert, K = hp_.n_expert_used, F = X.n_ff;
  group_expert_.clear();
  group_start_.clear();
  row_token_.clear();
  row_w_.clear();
  for (int64_t e = 0; e < NE; ++e) {
    const size_t first = row_token_.size();
    for (int64_t i = 0; i < T * K; ++i)
      if (chosen_[size_t(i)] == e) {
        row_token_.push_back(int32_t(i / K));
        row_w_.push_back(chosen_w_[size_t(i)]);
      }
    if (row_token_.size() == first) continue;
    group_expert_.push_back(int32_t(e));
    group_start_.push_back(int32_t(first));
  }
  group_start_.push_back(int32_t(row_token_.size()));
  const int64_t n_groups = int64_t(group_expert_.size());
  for (size_t r = 0; r < row_token_.size(); ++r) std::copy_n(xn_.data() + row_token_[r] * E, E, moe_x_.data() + r * E);
  // Blocks per expert: enough for every thread to have a few even when few experts run.
  const int64_t nth = pool.size();
  const auto split = [&](int64_t rows) {
    const int64_t parts = std::max<int64_t>(1, (4 * nth + n_groups - 1) / n_groups);
    return std::max<int64_t>(16, ((rows + parts - 1) / parts + 15) / 16 * 16);
  };
  const int64_t per_f = split(F), per_e = split(E);
  const int64_t f_blocks = (F + per_f - 1) / per_f, e_blocks = (E + per_e - 1) / per_e;
  pool.for_chunks(n_groups * f_blocks, [&](int64_t c, int) {
    const int64_t g = c / f_blocks, f0 = (c % f_blocks) * per_f, f1 = std::min(F, f0 + per_f);
    const size_t e = size_t(group_expert_[size_t(g)]);
    const int64_t r0 = group_start_[size_t(g)], n = group_start_[size_t(g) + 1] - r0;
    float* gate = moe_gate_.data() + r0 * F;
    float* up = moe_up_.data() + r0 * F;
    matmul_rows(X.gate[e].w, moe_x_.data() + r0 * E, E, n, gate, F, f0, f1);
    matmul_rows(X.up[e].w, moe_x_.data() + r0 * E, E, n, up, F, f0, f1);
    const ActRows act{gate, up, F, activation_, X.gate[e].bias, X.up[e].bias};
    act_rows_done(&act, -1, n, f0, f1);
  });
  pool.for_chunks(n_groups * e_blocks, [&](int64_t c, int) {
    const int64_t g = c / e_blocks, c0 = (c % e_blocks) * per_e, c1 = std::min(E, c0 + per_e);
    const Linear& down = X.down[size_t(group_expert_[size_t(g)])];
    const int64_t r0 = group_start_[size_t(g)], n = group_start_[size_t(g) + 1] - r0;
    matmul_rows(down.w, moe_gate_.data() + r0 * F, F, n, moe_y_.data() + r0 * E, E, c0, c1);
    if (down.bias) add_bias_cols(moe_y_.data() + r0 * E, E, down.bias, n, c0, c1);
  });
  for (size_t r = 0; r < row_token_.size(); ++r)  // experts in order: each token's sum in expert order
    add_weighted(moe_out_.data() + row_token_[r] * E, moe_y_.data() + int64_t(r) * E, row_w_[r], 0, E);
}

// Qwen2-MoE's shared expert over every token, scaled by sigmoid(xn . gate), added to moe_out_.
void DecoderModel::shared_expert(const Experts& X, int64_t T, ThreadPool& pool) {
  const int64_t E = hp_.n_embd;
  {
    const int64_t S = X.sh_n_ff;
    const ActRows act{gate_.data(), up_.data(), S, activation_};
    const Linear* gu[] = {&X.sh_gate, &X.sh_up};
    float* const ys[] = {gate_.data(), up_.data()};
    const int64_t lds[] = {S, S};
    apply_linears_shared(gu, ys, lds, xn_.data(), E, T, pool, RowsDone{act_rows_done, &act, true}, InputRmsNorm{},
                         hooks_);
    apply_linear(X.sh_down, gate_.data(), S, T, moe_y_.data(), E, pool, hooks_);
    for (int64_t t = 0; t < T; ++t) {
      float* out = moe_out_.data() + t * E;
      const float* y = moe_y_.data() + t * E;
      if (!X.sh_gate_inp) {  // Granite: the shared expert's output added as is
        for (int64_t c = 0; c < E; ++c) out[c] += y[c];
        continue;
      }
      const float* xt = xn_.data() + t * E;
      float dot = 0.0f;
      for (int64_t c = 0; c < E; ++c) dot += xt[c] * X.sh_gate_inp[c];
      const float g = 1.0f / (1.0f + std::exp(-dot));
      for (int64_t c = 0; c < E; ++c) out[c] += g * y[c];
    }
  }
}

// One decode token: its n_expert_used experts all read the same row, so their gate and up
// matrices are one shared-input matmul (one region, the row quantized once; each expert's
// activation applied as its rows finish) and their down matrices one more region over all
// their rows, instead of two regions per expert. Bytes read: the chosen experts' only.
struct ExpertsAct {
  float* gate;      // [K][F] receives act(gate + gate_bias) * (up + up_bias)
  float* up;        // [K][F]
  int64_t F;
  FfnActivation act;
  const float* const* gate_bias;  // [K] each chosen expert's biases [F] (gpt-oss), or nullptr
  const float* const* up_bias;
};
void experts_act_done(const void* ctx, int j, int64_t, int64_t r0, int64_t r1) {
  const ExpertsAct& a = *static_cast<const ExpertsAct*>(ctx);
  const ActRows one{a.gate + j * a.F, a.up + j * a.F, a.F, a.act, a.gate_bias ? a.gate_bias[j] : nullptr,
                    a.up_bias ? a.up_bias[j] : nullptr};
  act_rows_done(&one, -1, 1, r0, r1);
}

void DecoderModel::moe_decode_token(const Experts& X, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, K = hp_.n_expert_used, F = X.n_ff;
  std::vector<MatmulTarget>& targets = moe_targets_;
  targets.clear();
  const float* gate_b[64];
  const float* up_b[64];
  TERN_ASSERT(K <= 64);
  for (int64_t j = 0; j < K; ++j) {
    const size_t e = size_t(chosen_[size_t(j)]);
    targets.push_back(MatmulTarget{X.gate[e].w, moe_gate_.data() + j * F, F});
    targets.push_back(MatmulTarget{X.up[e].w, moe_up_.data() + j * F, F});
    gate_b[j] = X.gate[e].bias;
    up_b[j] = X.up[e].bias;
  }
  const bool biased = X.gate[0].bias != nullptr;
  const ExpertsAct act{moe_gate_.data(), moe_up_.data(), F, activation_, biased ? gate_b : nullptr,
                       biased ? up_b : nullptr};
  // One joint group per expert (its gate and up), so that a chunk reads up to the expert's whole
  // matrices (long streams) instead of a few rows of every chosen expert's.
  matmul_shared_input(targets, xn_.data(), E, 1, pool, RowsDone{experts_act_done, &act, true, 2});
  // The downs: each chosen expert's n_embd rows in blocks, one matmul_rows call per block (which
  // quantizes the expert's activation row again and starts a new stream), about 16 blocks per
  // thread, each of at least 64 KiB of weights, in whole 16-row groups (the interleaved layout's,
  // a multiple of the kernels' 4-row tile). Shorter streams read slower: on qwen3moe-mini (Q4_0
  // downs of 216-byte rows, 2 threads, Zen 4, the probe at 35 GB/s) blocks of 64 rows (14 KB)
  // read 19 GB/s where the output matrix read 32, blocks of 256 rows 32 GB/s (tg 178-185 ->
  // 207-211 tok/s).
  const int64_t row_bytes = std::max<int64_t>(1, X.down[size_t(chosen_[0])].w.row_bytes());
  const int64_t want_rows = std::max((int64_t(64) << 10) / row_bytes, K * E / (16 * int64_t(pool.size())));
  const int64_t blocks = std::max<int64_t>(1, E / std::max<int64_t>(1, want_rows));
  const int64_t rows = std::min(E, ((E + blocks - 1) / blocks + 15) / 16 * 16);
  const int64_t per_expert = (E + rows - 1) / rows;  // (rows rounded up: maybe fewer blocks)
  pool.for_chunks(K * per_expert, [&](int64_t c, int) {
    const int64_t j = c / per_expert, r0 = (c % per_expert) * rows, r1 = std::min(E, r0 + rows);
    const Linear& down = X.down[size_t(chosen_[size_t(j)])];
    matmul_rows(down.w, moe_gate_.data() + j * F, F, 1, moe_y_.data() + j * E, E, r0, r1);
    if (down.bias) add_bias_cols(moe_y_.data() + j * E, E, down.bias, 1, r0, r1);
  });
  // Summed in expert order, as experts_over_tokens does: the same bits for a token either way.
  int32_t order[64];
  TERN_ASSERT(K <= 64);
  for (int64_t j = 0; j < K; ++j) order[j] = int32_t(j);
  std::sort(order, order + K, [&](int32_t a, int32_t b) { return chosen_[size_t(a)] < chosen_[size_t(b)]; });
  float* out = moe_out_.data();
  for (int64_t i = 0; i < K; ++i) {
    const int64_t j = order[i];
    const float w = chosen_w_[size_t(j)];
    const float* y = moe_y_.data() + j * E;
    for (int64_t c = 0; c < E; ++c) out[c] += w * y[c];
  }
}

// One pool region for the whole pass, in phases (PhasedWork: each thread runs its own units and
// steals a late thread's; a phase starts when the previous one is complete). Per layer:
//   A  one unit per KV head: its GQA group's q/k/v rows, their biases, head norms and RoPE,
//      cache writes and attention (a group needs nothing from the other groups)
//   B  n_embd rows of o, added into the residual
//   C  n_ff rows of gate and up, and their SwiGLU / GeGLU
//   D  n_embd rows of down, added into the residual
// then the vocab rows of the output. RMSNorm of the (small) residual is recomputed by each
// thread into its own buffer when it first needs it in a phase, instead of one more phase.
// Row units start at multiples of 4, the kernels' row tile, so every output equals the pooled
// path's bit for bit. Dense layers without post-norms (is_phased_capable()).
void DecoderModel::forward_spmd(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits,
                                ThreadPool& pool) {
  const int64_t E = hp_.n_embd, Eq = hp_.n_embd_q(0), Ekv = hp_.n_embd_kv(), F = hp_.n_ff, V = hp_.n_vocab;
  const int64_t hd = hp_.head_dim, g = hp_.n_head / hp_.n_head_kv;
  const float scale = hp_.attn_scale != 0.0f ? hp_.attn_scale : 1.0f / std::sqrt(float(hd));
  int64_t n_out_rows = 0;
  for (const auto& s : seqs) n_out_rows += s.all_logits ? int64_t(s.tokens.size()) : 1;

  // One unit per thread and phase (rows a multiple of 4; KV heads): each unit costs a few
  // calls' set-up, comparable to its arithmetic at this size (stories260K on 2 threads: two
  // units per thread 48k tok/s, one 51k). A late thread's unit is still taken by the other.
  const int64_t nth = pool.size();
  auto rows_per_unit = [&](int64_t n) { return ((n + nth - 1) / nth + 3) / 4 * 4; };
  const int64_t per_e = rows_per_unit(E), per_f = rows_per_unit(F), per_v = rows_per_unit(V);
  int64_t per_kvh = (hp_.n_head_kv + nth - 1) / nth;
  // A quantized arena's blocks may span KV heads (stories260K: 4 heads of 8 in one block of 32):
  // a unit stores whole blocks, so its heads cover a multiple of the block.
  if (kv.type() != KvType::F32 && kv.type() != KvType::F16) {
    const int64_t heads_per_block = kKvQuantBlock / std::gcd(hd, kKvQuantBlock);
    per_kvh = (per_kvh + heads_per_block - 1) / heads_per_block * heads_per_block;
  }
  auto units = [](int64_t n, int64_t per) { return int32_t((n + per - 1) / per); };
  phase_units_.clear();
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    phase_units_.push_back(units(hp_.n_head_kv, per_kvh));
    phase_units_.push_back(units(E, per_e));
    phase_units_.push_back(units(F, per_f));
    phase_units_.push_back(units(E, per_e));
  }
  phase_units_.push_back(units(V, per_v));
  spmd_work_.reset(phase_units_, pool.size());
  ThreadPool& serial = serial_;  // no threads: the row-wise ops below run on the calling thread

  pool.run([&](int ith, int) {
    thread_local std::vector<float> xn;        // [T, n_embd] this thread's normalised residual
    thread_local std::vector<float> out_rows;  // [n_out_rows, n_embd]
    xn.resize(size_t(T * E));
    int normed_for = -1;  // the phase whose input xn holds
    spmd_work_.run(ith, [&](int phase, int unit) {
      const int64_t il = phase / 4;
      if (il == hp_.n_layer) {  // output projection
        if (normed_for != phase) {
          out_rows.resize(size_t(n_out_rows * E));
          gather_output_rows(seqs, out_rows.data());
          rms_norm(out_rows.data(), output_norm_, out_rows.data(), n_out_rows, E, hp_.rms_eps, serial);
          normed_for = phase;
        }
        const int64_t v0 = unit * per_v, v1 = std::min(V, v0 + per_v);
        matmul_rows(output_.w, out_rows.data(), E, n_out_rows, logits, V, v0, v1);
        if (hp_.final_softcap > 0.0f)
          for (int64_t r = 0; r < n_out_rows; ++r) softcap_inplace(logits + r * V + v0, v1 - v0, hp_.final_softcap);
        return;
      }
      const LayerWeights& L = layers_[size_t(il)];
      switch (phase % 4) {
        case 0: {
          if (normed_for != phase) {
            rms_norm(x_.data(), L.attn_norm, xn.data(), T, E, hp_.rms_eps, serial);
            normed_for = phase;
          }
          // KV heads [h0, h1): their GQA groups' q rows, their k / v rows
          const int64_t h0 = unit * per_kvh, h1 = std::min(hp_.n_head_kv, h0 + per_kvh);
          const int64_t q0 = h0 * g * hd, q1 = h1 * g * hd, k0 = h0 * hd, k1 = h1 * hd;
          matmul_rows(L.q.w, xn.data(), E, T, q_.data(), Eq, q0, q1);
          matmul_rows(L.k.w, xn.data(), E, T, k_.data(), Ekv, k0, k1);
          matmul_rows(L.v.w, xn.data(), E, T, v_.data(), Ekv, k0, k1);
          // The pooled path's steps on these heads' columns: biases, head norms, RoPE.
          if (L.q.bias) add_bias_cols(q_.data(), Eq, L.q.bias, T, q0, q1);
          if (L.k.bias) add_bias_cols(k_.data(), Ekv, L.k.bias, T, k0, k1);
          if (L.v.bias) add_bias_cols(v_.data(), Ekv, L.v.bias, T, k0, k1);
          if (L.q_norm) {
            rms_norm_heads(q_.data() + q0, Eq, L.q_norm, T, (h1 - h0) * g, hd, hp_.rms_eps);
            rms_norm_heads(k_.data() + k0, Ekv, L.k_norm, T, h1 - h0, hd, hp_.rms_eps);
          }
          const float* cs = hp_.is_swa(il) && has_swa_rope() ? rope_cs_swa_.data() : rope_cs_.data();
          if (hp_.rope_layout == RopeLayout::Neox) {
            rope_neox_table(q_.data() + q0, Eq, cs, T, (h1 - h0) * g, hd, hp_.n_rot);
            rope_neox_table(k_.data() + k0, Ekv, cs, T, h1 - h0, hd, hp_.n_rot);
          } else {
            rope_cols_table(q_.data(), Eq, cs, T, hd, hp_.n_rot, q0, q1);
            rope_cols_table(k_.data(), Ekv, cs, T, hd, hp_.n_rot, k0, k1);
          }
          const void* kc = kv.k(il);
          const void* vc = kv.v(il);
          int64_t t = 0;
          for (const auto& s : seqs) {
            const int64_t n = int64_t(s.tokens.size());
            for (int64_t i = 0; i < n; ++i) {
              const int64_t slot = s.slots[size_t(s.n_past + i)];
              kv.store(il, slot, h0 * hd, k_.data() + (t + i) * Ekv + h0 * hd, v_.data() + (t + i) * Ekv + h0 * hd,
                       (h1 - h0) * hd);
            }
            AttentionArgs args{q_.data() + t * Eq, Eq, attn_.data() + t * Eq, Eq, kc, vc, Ekv, s.slots.data(),
                               s.n_past, n, hp_.n_head, hp_.n_head_kv, hd, scale, kv.type()};
            args.softcap = hp_.attn_softcap;
            args.window = hp_.is_swa(il) ? hp_.n_swa : 0;
            args.sinks = L.attn_sinks;
            for (int64_t kvh = h0; kvh < h1; ++kvh) attention_kv_head(args, kvh);
            t += n;
          }
          break;
        }
        case 1:
        case 3: {
          const int64_t e0 = unit * per_e, e1 = std::min(E, e0 + per_e);
          const Linear& l = phase % 4 == 1 ? L.o : L.down;
          matmul_rows(l.w, phase % 4 == 1 ? attn_.data() : gate_.data(), phase % 4 == 1 ? Eq : F, T, xn_.data(), E, e0, e1);
          if (l.bias) add_bias_cols(xn_.data(), E, l.bias, T, e0, e1);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t e = e0; e < e1; ++e) x_[size_t(t * E + e)] += xn_[size_t(t * E + e)];
          break;
        }
        case 2: {
          if (normed_for != phase) {
            rms_norm(x_.data(), L.ffn_norm, xn.data(), T, E, hp_.rms_eps, serial);
            normed_for = phase;
          }
          const int64_t f0 = unit * per_f, f1 = std::min(F, f0 + per_f);
          matmul_rows(L.gate.w, xn.data(), E, T, gate_.data(), F, f0, f1);
          matmul_rows(L.up.w, xn.data(), E, T, up_.data(), F, f0, f1);
          const ActRows act{gate_.data(), up_.data(), F, activation_, L.gate.bias, L.up.bias};
          act_rows_done(&act, -1, T, f0, f1);
          break;
        }
      }
    });
  });
}

}  // namespace

std::unique_ptr<Model> make_decoder(const ArchSpec& spec, std::shared_ptr<const GgufFile> file,
                                    const ModelPartition& part) {
  return std::make_unique<DecoderModel>(spec, std::move(file), part);
}

}  // namespace tern
