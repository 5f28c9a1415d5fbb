#pragma once
// QAT of a LoRA fine-tune (`tern finetune --qat TYPE`; QA-LoRA's aim: an adapter trained for the
// quantized model it is merged into). The forward runs the merged model as the export stores it:
//
//   W_q = Q(W0 + s B A)   every adapted matrix: A [rank][n_in], B [n_out][rank], s = alpha / rank
//   W_q = Q(W0)           the base's other matrices
//
// with Q the fake quantizer of train/qat.h (QatModel over merged(), per the plan's type: the
// codec's own round trip, or LSQ's learned scales). The backward takes dL/dW_q through the merged
// weight's clipped straight-through estimator (QatModel::straight_through) to G = dL/dW, then by
// the chain rule to the adapter:
//
//   dL/dB = s G A^T   [n_out][rank]          dL/dA = s B^T G   [rank][n_in]
//
// W0 is frozen; merged() is recomputed from the adapter after every optimizer step. In f32:
// P = B A (train/gemm.h: one FMA chain over the rank per element, the same bits for any thread
// count), then merged = W0 + s * P.
//
// The product of such a run is the merged, quantized model (bit for bit what the forward used);
// the adapter alone applied to a quantized base is not: Q(W0 + s B A) != Q(W0) + s B A.
//
// Cost per step, over a plain LoRA step: the forward and the input gradient as before, plus dW of
// each adapted matrix (n_tok * n_in * n_out), the merge and the two chain products
// (2-3 * rank * n_in * n_out per adapted matrix), and the quantization and transposition of
// every matrix (linear in the model's size): fine for the small models tern trains.
#include <cstdint>
#include <vector>

#include "train/lora.h"
#include "train/model.h"

namespace tern {
class ThreadPool;
}

namespace tern::train {

class LoraMerge {
 public:
  // base: the frozen model with f32 weights (load_model, not an encoded base); lora: made for
  // its shape (make_lora). Both must outlive this object. Throws tern::Error naming an encoded
  // base, or an adapted tensor the base lacks or whose shape differs.
  LoraMerge(const TrainModel& base, const LoraWeights& lora, ThreadPool* pool);

  // merged() = the base with each adapted matrix W0 + s B A, from the adapter's current values.
  void update();
  const TrainModel& merged() const { return merged_; }

  // g: d(loss)/d(merged weights) in the model's layout (after the straight-through estimator);
  // writes the adapter's gradient (its layout) into g_lora.
  void backward(const float* g, float* g_lora);

  // The adapted matrices' offsets in the model's layout (their dW is what the backward needs).
  const std::vector<int64_t>& adapted_offsets() const { return adapted_offsets_; }

 private:
  const TrainModel& base_;
  const LoraWeights& lora_;
  ThreadPool* pool_;
  TrainModel merged_;
  std::vector<int64_t> adapted_offsets_;  // per slot: the target's offset in the model's data
  std::vector<float> prod_, a_t_;         // B A [n_out][n_in]; A^T [n_in][rank]
};

}  // namespace tern::train
