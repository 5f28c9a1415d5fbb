#pragma once
// AdamW (Loshchilov & Hutter: weight decay decoupled from the gradient), the learning-rate
// schedule (linear warm-up, then cosine decay to min_lr) and gradient clipping by global norm,
// with PyTorch's semantics (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_), so that a run
// can be checked step by step against PyTorch.
#include <cstdint>
#include <vector>

#include "train/model.h"

namespace tern {
class ThreadPool;
}

namespace tern::train {

struct OptimizerConfig {
  float lr = 1e-3f, min_lr = 1e-4f;
  int64_t warmup = 0;          // steps of linear warm-up
  int64_t total_steps = 1;     // the cosine reaches min_lr here
  float weight_decay = 0.1f;   // on matrices only (ParamInfo::decay)
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float clip = 1.0f;           // max global L2 norm of the gradient; 0: no clipping
};

// The learning rate of step `step` (0-based).
double learning_rate(const OptimizerConfig& c, int64_t step);

// The global L2 norm of g (in double, in a fixed order: the same bits for any thread count).
double global_norm(const float* g, int64_t n);

class AdamW {
 public:
  AdamW(const OptimizerConfig& config, int64_t n_params);

  // One update of `model` from gradient g (scaled by the clip factor first when its norm exceeds
  // config.clip). `step` is the 0-based index of this update (it sets the learning rate and the
  // bias corrections). Returns the norm before clipping.
  double step(TrainModel& model, float* g, int64_t step, ThreadPool* pool);
  // The same over any parameter table: `data` holds the tensors `params` names (a LoRA adapter's).
  double step(const std::vector<ParamInfo>& params, std::vector<float>& data, float* g, int64_t step, ThreadPool* pool);

  // Sparse fine-tuning (recovery after `tern prune`): the entries of the matrices (ParamInfo::decay)
  // that are exactly 0 in `data` now keep gradient 0 in every later step, so they stay 0 (AdamW
  // moves nothing whose gradient, moments and weight are 0) and the clipping norm is the sparse
  // model's. Returns how many entries were frozen.
  int64_t freeze_zeros(const std::vector<ParamInfo>& params, const std::vector<float>& data);

  // State, for checkpoints.
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const OptimizerConfig& config() const { return config_; }
  void set_config(const OptimizerConfig& c) { config_ = c; }

 private:
  OptimizerConfig config_;
  std::vector<float> m_, v_;
  std::vector<uint8_t> frozen_;  // [n_params] 1: gradient forced to 0 (empty: none)
};

}  // namespace tern::train
