#pragma once
// Quantization-aware training (`tern train --qat TYPE`): the forward and the backward run on the
// model's matrices as they will be stored, and the optimizer updates full-precision "latent"
// weights behind them.
//
//   forward:   W_q = Q(W) for every planned matrix (the rest: W itself)
//   backward:  dL/dW = dL/dW_q * pass(W)         (the straight-through estimator, clipped)
//
// Q is, per tensor, the storage type a `tern quantize --type TYPE` of the model would give it
// (llama-quantize's rules: compress/quantize.h's default_tensor_type, with the row-size fallback),
// so the trained model exports to that file with no further loss:
//   - codec types (q4_0, q8_0, q2_k, q4_k, ...): Q(W) = to_float(from_float(row)), the traits
//     table's own quantizer and dequantizer, so W_q is bit for bit what the file will hold;
//   - ternary (tq1_0, tq2_0): BitNet b1.58's absmean ternarization per 256-weight block,
//     d = f16(mean |w|), Q(w) = d * clamp(round(w / d), -1, 1). The format's own quantizer
//     (absmax) reproduces these values exactly, so the export goes through it losslessly.
//
// LSQ (--qat-lsq; Esser et al., "Learned Step Size Quantization"): for the formats whose block is
// one scale times integer codes (q4_0: -8..7 per 32, q8_0: -127..127 per 32, ternary: -1..1 per
// 256) the scale s of every block is a parameter too, trained by its own AdamW beside the weights:
//
//   W_q = s' q,  q = clamp(round(w / s'), qmin, qmax),  s' = f16(s) (what the file stores)
//   dL/dw = dL/dW_q where qmin <= w / s' <= qmax, else 0
//   dL/ds = g * sum over the block of dL/dW_q * (q - w / s' inside, qmin or qmax where clamped)
//   g = 1 / sqrt(block * qmax)                      (LSQ's gradient scale)
//
// AdamW updates log s (a step then changes a scale by about lr relative to itself; scales are
// 100 to 1000 times smaller than the weights whose lr it is), from s dL/ds.
//
// s starts where the codec would put it (q4_0: max |w| / 8, q8_0: max |w| / 127, ternary:
// mean |w|). The export stores s' and q as they are: a q4_0 / q8_0 block is packed directly (the
// codec's own rule would pick another scale), a ternary one goes through the absmax quantizer,
// which holds it exactly. Tensors of other types in the plan keep the codec path.
//
// pass(w) is 0 where the quantizer saturates: the weight lies more than 5/8 of a step beyond the
// extreme values of its group (a clamp's gradient is 0 outside its range; rounding alone moves a
// weight by half a step, and 1/8 absorbs the f16 scale's own rounding), 1 elsewhere. For
// ternary, |w| > 1.5 d. A group's step follows from its quantized values and the format's level
// count (table in qat.cpp); f16 / bf16 never clip.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "train/model.h"
#include "train/optimizer.h"

namespace tern {
class ThreadPool;
}

namespace tern::train {

// Whether QAT quantizes tensors of type t by absmean ternarization (else by t's codec).
bool qat_is_ternary(DType t);

// One row's quantize -> dequantize: dst[n] = Q(src[n]); pass[n] (may be nullptr) = the STE's mask.
// n is a multiple of t's block size; t has a codec (or is ternary). Throws tern::Error otherwise.
void qat_fake_quantize_row(DType t, const float* src, float* dst, uint8_t* pass, int64_t n);

// The latent model's fake-quantized twin.
// Whether LSQ can learn the scales of type t (one scale per block times integer codes).
bool qat_lsq_supported(DType t);

class QatModel {
 public:
  // types: per latent.params entry, the storage type its forward uses (F32: trained as it is;
  // only 2-D f32 parameters may have another). Throws tern::Error naming the tensor when a type
  // has no codec or the tensor's rows do not fit its blocks. lsq: learned scales for the tensors
  // whose type qat_lsq_supported (an error when none is).
  QatModel(const TrainModel& latent, std::vector<DType> types, ThreadPool* pool, bool lsq = false);

  // quantized() = Q(latent) and the STE masks, from the latent weights' current values.
  void update(const TrainModel& latent);
  const TrainModel& quantized() const { return q_; }
  const std::vector<DType>& types() const { return types_; }

  // grads (the model's layout): d(loss)/d(W_q) in, d(loss)/d(W) out, zero where clipped. With
  // LSQ it first computes the scales' gradient (scale_grads()) from d(loss)/d(W_q).
  void straight_through(float* grads);

  // LSQ: the scales (one per block of each learned tensor, in params order), their gradient from
  // the last straight_through, and their optimizer. scale_offset(i): tensor i's first scale
  // (-1: its scales are not learned).
  bool lsq() const { return lsq_; }
  const std::vector<float>& scales() const { return scales_; }
  // What the optimizer trains: log s (step_scales); a checkpoint stores these.
  const std::vector<float>& log_scales() const { return log_scales_; }
  void set_log_scales(const std::vector<float>& u);
  const std::vector<float>& scale_grads() const { return scale_grads_; }
  int64_t scale_offset(size_t param) const { return scale_offset_.empty() ? -1 : scale_offset_[param]; }
  int64_t scale_count(size_t param) const;  // tensor i's scales (0: not learned)
  AdamW& scale_optimizer() { return *scale_opt_; }
  const std::vector<ParamInfo>& scale_params() const { return scale_params_; }
  // One AdamW step of the scales (the weights' schedule and settings, no weight decay); returns
  // the gradient's norm.
  double step_scales(const OptimizerConfig& c, int64_t step);
  // LSQ: row r of tensor i as the file stores it, into dst (dtype_row_bytes of its type).
  void encode_lsq_row(size_t param, int64_t r, uint8_t* dst) const;
  // Weights whose gradient the last update() clips, and those that are quantized at all.
  int64_t n_clipped() const { return n_clipped_; }
  int64_t n_quantized() const { return n_quantized_; }
  // "q4_0 x 14, q6_k x 1 (f32: 11 tensors)", with " +lsq" when the scales are learned
  std::string describe() const;

 private:
  void update_lsq(size_t param, const float* w, float* dst, uint8_t* pass, int64_t n_rows);

  TrainModel q_;
  std::vector<DType> types_;
  bool lsq_ = false;
  std::vector<int64_t> scale_offset_;  // per param: first scale, -1 when not learned
  std::vector<float> scales_, scale_grads_, log_scales_;  // s = exp(log s)
  std::vector<ParamInfo> scale_params_;  // one entry: "qat.scales"
  std::unique_ptr<AdamW> scale_opt_;
  const TrainModel* latent_ = nullptr;   // the model the last update() read (for the scale gradient)
  std::vector<uint8_t> pass_;  // [n_params]: 1 where the gradient passes (1 for unquantized tensors)
  ThreadPool* pool_;
  int64_t n_clipped_ = 0, n_quantized_ = 0;
};

}  // namespace tern::train
