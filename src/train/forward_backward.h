#pragma once
// One micro-batch through the training model: the forward keeps what the backward needs
// (per layer: the residual input, the normed inputs, q/k/v after RoPE, the attention output and
// its log-sum-exp, the FFN's gate/up/product), then the backward writes every parameter's
// gradient. Attention keeps no T x T matrix (train/attention.h recomputes it).
//
// The loss on the logits is pluggable (LossFn): cross-entropy for training, the distillation
// losses of train/distill.h, each turning the logits into their gradient in place.
#include <cstdint>
#include <functional>
#include <vector>

#include "train/model.h"

namespace tern {
class ThreadPool;
}

namespace tern::train {

// logits [n][n_vocab] in, d(loss)/d(logits) out (in place); targets [n] (-1: no loss at that
// row). Returns the loss summed over the rows; the caller's mean is sum / n_counted, so the
// gradient written must be that of the sum times `grad_scale`.
using LossFn = std::function<double(float* logits, const int32_t* targets, int64_t n, int64_t n_vocab,
                                    float grad_scale)>;

class ForwardBackward {
 public:
  // Buffers for micro-batches of n_seq sequences of n_ctx tokens.
  ForwardBackward(const ModelShape& shape, int64_t n_seq, int64_t n_ctx, ThreadPool* pool);

  // Caches W^T of every matrix (the forward's B operands). Call after every change of the weights.
  void prepare(const TrainModel& model);

  // windows [n_seq][n_ctx + 1] token ids: inputs are [0, n_ctx), targets [1, n_ctx].
  // Adds grad_scale * d(mean loss)/d(params) to grads (layout of model.data); returns the mean
  // loss over the n_seq * n_ctx targets. loss = nullptr: cross-entropy.
  double forward_backward(const TrainModel& model, const int32_t* windows, float* grads, float grad_scale,
                          const LossFn* loss = nullptr);

  // Forward only: the mean cross-entropy over the windows' targets (validation).
  double forward_loss(const TrainModel& model, const int32_t* windows);

  // The logits of the last forward, [n_seq * n_ctx][n_vocab] (before the loss touched them:
  // valid after forward_loss; after forward_backward they hold the loss's gradient).
  const float* logits() const { return logits_.data(); }

  int64_t n_seq() const { return n_seq_; }
  int64_t n_ctx() const { return n_ctx_; }
  // Multiply-adds per micro-batch (forward + backward), for FLOP/s reports: matrices and attention.
  double flops_per_batch() const;

 private:
  void forward(const TrainModel& model, const int32_t* windows);

  ModelShape shape_;
  int64_t n_seq_, n_ctx_, n_tok_;
  ThreadPool* pool_;
  std::vector<int32_t> inputs_, targets_;  // [n_tok]
  std::vector<float> weights_t_;           // every matrix transposed, layout of weight_t_offset_
  std::vector<int64_t> weight_t_offset_;   // per param (-1: not a matrix)
  struct LayerActs {
    std::vector<float> x, h1, rstd1, q, k, v, o, lse, x_mid, h2, rstd2, gate, up, gate_sig, act;
  };
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, h_final_, rstd_final_, logits_;
  // backward scratch
  std::vector<float> dx_, dh_, dq_, dk_, dv_, do_, dact_, dgate_, dup_, tmp_;
};

}  // namespace tern::train
