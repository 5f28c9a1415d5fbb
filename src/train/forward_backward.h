#pragma once
// One micro-batch through the training model: the forward keeps what the backward needs
// (per layer: the residual input, the normed inputs, q/k/v after RoPE, the attention output and
// its log-sum-exp, the FFN's gate/up/product), then the backward writes every parameter's
// gradient. Attention keeps no T x T matrix (train/attention.h recomputes it).
//
// The loss on the logits is pluggable (LossFn): cross-entropy for training, the distillation
// losses of train/distill.h, each turning the logits into their gradient in place.
// Distillation on hidden states adds losses inside the model (set_hidden_loss on layers'
// residual-stream outputs, set_attention_loss on their queries and keys): each sees the forward's
// values and writes its gradient, which the backward adds where those values enter it.
//
// LoRA (train/lora.h): with set_lora(), the adapted linears add s * drop(x) A^T B^T and the
// backward writes the gradient of the adapter's A and B only: the base is frozen, so its weight
// gradients (the dW products, the norms', the embedding's) are not computed; the input
// gradients run through both the base weights and the adapter.
//
// Layers may differ (a structured-pruned model: ModelShape::head_count(il) etc.): each layer's
// activations have its own widths, the backward scratch the widest layer's; a layer's optional
// attn_output / ffn_down bias is added to that projection's output, and its gradient is the
// output gradient summed over the tokens.
//
// A base from load_frozen_base may keep its matrices encoded (f16, bf16, quantized: QLoRA). Such
// a linear's products dequantize a tile of W's rows at a time into scratch and multiply it with
// the same f32 gemm, so the results are those of the dequantized f32 model bit for bit (each
// output element is still one FMA chain over k in order: train/gemm.h); the embedding lookup
// dequantizes the looked-up rows. Such a model trains only with an adapter (the base is frozen).
#include <cstdint>
#include <functional>
#include <vector>

#include "train/model.h"

namespace tern {
class ThreadPool;
struct QuantTraits;
}

namespace tern::train {

// logits [n][n_vocab] in, d(loss)/d(logits) out (in place); targets [n] (-1: no loss at that
// row). Returns the loss summed over the rows; the caller's mean is sum / n_counted, so the
// gradient written must be that of the sum times `grad_scale`.
using LossFn = std::function<double(float* logits, const int32_t* targets, int64_t n, int64_t n_vocab,
                                    float grad_scale)>;

// A loss on hidden states (feature / relation distillation: train/distill_hidden.h). states[i] is
// the residual-stream output of the i-th requested layer (after its FFN; the last layer's is the
// input of the output norm), [n_tok][n_embd], read-only; grads[i] (zeroed, same shape) receives
// grad_scale * d(loss)/d(states[i]). Returns the loss summed as LossFn's is (the caller's mean
// divides it by the scored targets).
using HiddenLossFn = std::function<double(const std::vector<const float*>& states, const std::vector<float*>& grads,
                                          int64_t n_tok, int64_t n_embd, float grad_scale)>;

// A window entry for token `id` that is read as an input but is not a target (no loss on
// predicting it: the prompt of a prompt/completion example, padding). Entries >= 0 are tokens
// that are both.
constexpr int32_t unscored_token(int32_t id) { return -2 - id; }
constexpr int32_t token_of_entry(int32_t e) { return e >= 0 ? e : -2 - e; }

// A loss on the attention of some layers (attention-map distillation: train/distill_hidden.h):
// q[i] [n_tok][q_width(il)] and k[i] [n_tok][kv_width(il)] are the i-th requested layer's queries
// and keys after RoPE, which with the layer's scale 1 / sqrt(head_dim) give its attention
// probabilities; dq[i], dk[i] (zeroed, same shapes) receive grad_scale * the loss's gradient.
// Returns the loss summed as LossFn's is.
using AttentionLossFn =
    std::function<double(const std::vector<const float*>& q, const std::vector<const float*>& k,
                         const std::vector<float*>& dq, const std::vector<float*>& dk, float grad_scale)>;

struct LoraWeights;

class ForwardBackward {
 public:
  // Buffers for micro-batches of n_seq sequences of n_ctx tokens.
  ForwardBackward(const ModelShape& shape, int64_t n_seq, int64_t n_ctx, ThreadPool* pool);

  // Caches W^T of every f32 matrix (the forward's B operands; encoded ones get a tile scratch
  // instead). Call after every change of the weights.
  void prepare(const TrainModel& model);

  // Trains a LoRA adapter of the model from now on (nullptr: the model itself again). The
  // adapter must have been made for this shape (make_lora); call prepare_lora() after every
  // change of its weights. prepare(model) is still needed (once: the base does not change).
  void set_lora(const LoraWeights* lora);
  void prepare_lora();
  // The dropout masks of the next forward_backward are a function of this seed (and of the
  // adapted linear, token and feature); forward_loss uses none.
  void set_dropout_seed(uint64_t seed) { dropout_seed_ = seed; }
  // Rows per dequantized tile of an encoded matrix (0: about 4 MB of f32 per tile); call before
  // prepare(). Tests force small tiles so that several, and a partial last one, are exercised.
  void set_tile_rows(int64_t rows) { tile_rows_ = rows; }
  // Whether the forward of encoded W computes y's tiles transposed from x^T (small batches)
  // rather than transposing W's tiles; the same bits either way (tests check both are used).
  bool forward_by_x_t(const EncodedTensor& e) const;
  const LoraWeights* lora() const { return lora_; }
  // The weight gradients of these matrices only (their offsets in the model's data): the rest of
  // the model is frozen as under LoRA (no dW products, no norm, bias or embedding gradient, which
  // stay 0 in forward_backward's output; token_embd's offset in the list asks for its gradient).
  // QAT of a LoRA fine-tune (train/qat_lora.h) needs dL/dW of the adapted matrices alone. Empty:
  // every parameter (the default). Not with set_lora.
  void set_trained_weights(std::vector<int64_t> offsets);

  // windows [n_seq][n_ctx + 1] entries: inputs are [0, n_ctx), targets [1, n_ctx] (an entry
  // unscored_token(id) is input id and no target). Adds grad_scale * d(mean loss)/d(params) to
  // grads (layout of model.data; with set_lora, of the adapter's data); returns the mean loss
  // over the scored targets (0 when there is none). loss = nullptr: cross-entropy.
  double forward_backward(const TrainModel& model, const int32_t* windows, float* grads, float grad_scale,
                          const LossFn* loss = nullptr);

  // Adds a loss on the outputs of `layers` (0-based, any order, repeats allowed: states[i] is
  // layers[i]'s) to every later forward_backward: after the logits' loss, `fn` writes its
  // gradient, which the backward adds to the residual stream's gradient where each layer's output
  // enters it. forward_backward's loss is then the mean of both. Empty layers or fn: off (the
  // default; costs nothing). Throws tern::Error naming a layer out of range.
  void set_hidden_loss(std::vector<int64_t> layers, HiddenLossFn fn);
  // An L1 penalty on the FFN activations (ProSparse's way to more activation sparsity in a
  // ReLU-fied model): lambda * mean over neurons of |act| per token and layer, added to the
  // gradient only (the loss forward_backward returns stays the cross-entropy, comparable with
  // runs without it). 0: off. Throws tern::Error for a negative or non-finite lambda.
  void set_activation_l1(float lambda);
  // The residual-stream output of layer il of the last forward [n_tok][n_embd] (the teacher side of
  // feature distillation, which runs forward_loss only).
  const float* layer_output(int64_t il) const;
  // The same for a loss on the attention's queries and keys (AttentionLossFn): its gradient joins
  // the attention backward's dq, dk of each layer before RoPE is undone. Off by default.
  void set_attention_loss(std::vector<int64_t> layers, AttentionLossFn fn);
  // Layer il's queries [n_tok][q_width(il)] and keys [n_tok][kv_width(il)] after RoPE, last forward.
  const float* layer_q(int64_t il) const;
  const float* layer_k(int64_t il) const;

  // Forward only: the mean cross-entropy over the windows' scored targets (validation; no dropout).
  double forward_loss(const TrainModel& model, const int32_t* windows);
  // Forward only: the activation L1 penalty set_activation_l1 puts on the gradient, as a value
  // (lambda * sum over tokens and layers of mean_i |act| / scored targets): what its gradient is
  // the gradient of (tests), and the regularizer's size next to the loss.
  double activation_l1_penalty(const TrainModel& model, const int32_t* windows);
  // Scored targets of the last forward.
  int64_t n_scored() const { return n_scored_; }

  // The logits of the last forward, [n_seq * n_ctx][n_vocab] (before the loss touched them:
  // valid after forward_loss; after forward_backward they hold the loss's gradient).
  const float* logits() const { return logits_.data(); }

  int64_t n_seq() const { return n_seq_; }
  int64_t n_ctx() const { return n_ctx_; }
  // Multiply-adds per micro-batch (forward + backward), for FLOP/s reports: matrices and attention.
  double flops_per_batch() const;

 private:
  void forward(const TrainModel& model, const int32_t* windows, bool train);
  // A frozen or trained linear's W: f32 (W^T from prepare(), W in model.data) or encoded.
  struct Linear {
    const float* wt = nullptr;         // [in][out]
    const float* w = nullptr;          // [out][in]
    const EncodedTensor* enc = nullptr;
  };
  Linear linear_of(const TrainModel& model, int64_t offset) const;
  // y[n][out] (+)= x[n][in] W^T
  void linear_forward(int64_t in, int64_t out, const float* x, const Linear& w, float* y, bool accumulate);
  // dx[n][in] (+)= dy[n][out] W;  dw[out][in] += dy^T x (dw nullptr: W is frozen; f32 W only).
  void linear_backward(int64_t in, int64_t out, const float* x, const Linear& w, const float* dy, float* dx,
                       bool accumulate_dx, float* dw);
  // Rows of an encoded W per tile: a few MB of f32 scratch whatever the matrix.
  int64_t tile_rows(const EncodedTensor& e) const;
  // The traits of e's type; throws naming the mismatch when e is not out x in or prepare() was not run.
  const QuantTraits& check_encoded(const EncodedTensor& e, int64_t in, int64_t out) const;
  // tile_[0 .. r) = rows o0 .. o0 + r of e, dequantized (split over the pool).
  void dequantize_tile(const EncodedTensor& e, const QuantTraits& q, int64_t o0, int64_t r);
  // y [n][e] += b on every row; gb [e] += the column sums of dy [n][e] (a bias's gradient).
  void add_bias(int64_t n, int64_t e, const float* b, float* y);
  void bias_backward(int64_t n, int64_t e, const float* dy, float* gb);
  // y [n_tok][n_out] += s * drop(x) A^T B^T for the adapted (layer, kind); nothing when not adapted.
  void lora_forward(int64_t layer, int kind, const float* x, float* y, bool train);
  // dx [n_tok][n_in] += the adapter's input gradient; the adapter's dA, dB into g.
  void lora_backward(int64_t layer, int kind, const float* x, const float* dy, float* dx, float* g);

  ModelShape shape_;
  int64_t n_seq_, n_ctx_, n_tok_;
  ThreadPool* pool_;
  std::vector<int32_t> inputs_, targets_;  // [n_tok]
  std::vector<float> weights_t_;           // every matrix transposed, layout of weight_t_offset_
  std::vector<int64_t> weight_t_offset_;   // per param (-1: not a matrix, or an encoded one)
  // An encoded W's dequantized rows [R][in]; their transpose [in][R] or y's tile transposed
  // [R][n_tok]; x^T [in][n_tok] (forward_by_x_t).
  std::vector<float> tile_, tile_t_, x_t_;
  int64_t tile_rows_ = 0;
  // [n_tok][E] x, h1, x_mid, h2; [n_tok] rstd1, rstd2; [n_tok][q_width(il)] q, o; [n_tok][kv_width(il)]
  // k, v; [n_tok][head_count(il)] lse; [n_tok][ff_length(il)] gate, up, gate_sig, act.
  struct LayerActs {
    std::vector<float> x, h1, rstd1, q, k, v, o, lse, x_mid, h2, rstd2, gate, up, gate_sig, act;
  };
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, h_final_, rstd_final_, logits_;
  // backward scratch
  std::vector<float> dx_, dh_, dq_, dk_, dv_, do_, dact_, dgate_, dup_, tmp_;
  int64_t n_scored_ = 0;
  // Hidden-state loss (set_hidden_loss): the requested layers and a gradient [n_tok][n_embd] per request.
  std::vector<int64_t> hidden_layers_;
  HiddenLossFn hidden_fn_;
  float act_l1_ = 0.0f;  // set_activation_l1
  std::vector<std::vector<float>> hidden_grads_;
  // Attention loss (set_attention_loss): the requested layers, a dq and a dk per request.
  std::vector<int64_t> attn_layers_;
  AttentionLossFn attn_fn_;
  std::vector<std::vector<float>> attn_dq_, attn_dk_;
  std::vector<int64_t> trained_;         // set_trained_weights, sorted (empty: all)
  double trained_mac_per_token_ = 0.0;   // their dW products' multiply-adds per token (prepare)
  // LoRA
  const LoraWeights* lora_ = nullptr;
  std::vector<float> lora_t_;            // A^T [n_in][rank] and B^T [rank][n_out] at A's and B's offsets
  struct LoraActs {
    std::vector<float> xd;               // the dropped-out input [n_tok][n_in] (dropout > 0 only)
    std::vector<uint8_t> keep;           // its mask
    std::vector<float> u;                // s * drop(x) A^T [n_tok][rank]
    bool dropped = false;                // the last forward used xd
  };
  std::vector<LoraActs> lora_acts_;      // per slot
  std::vector<float> lora_du_, lora_dx_, norm_scratch_;
  uint64_t dropout_seed_ = 0;
};

}  // namespace tern::train
