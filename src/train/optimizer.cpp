#include "train/optimizer.h"

#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tern::train {

double learning_rate(const OptimizerConfig& c, int64_t step) {
  if (step < c.warmup) return double(c.lr) * double(step + 1) / double(c.warmup);
  const int64_t decay_steps = c.total_steps - c.warmup > 1 ? c.total_steps - c.warmup : 1;
  double progress = double(step - c.warmup) / double(decay_steps);
  if (progress > 1.0) progress = 1.0;
  return double(c.min_lr) + 0.5 * (double(c.lr) - double(c.min_lr)) * (1.0 + std::cos(M_PI * progress));
}

double global_norm(const float* g, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return std::sqrt(s);
}

AdamW::AdamW(const OptimizerConfig& config, int64_t n_params)
    : config_(config), m_(size_t(n_params), 0.0f), v_(size_t(n_params), 0.0f) {}

int64_t AdamW::freeze_zeros(const std::vector<ParamInfo>& params, const std::vector<float>& data) {
  frozen_.assign(data.size(), 0);
  int64_t n = 0;
  for (const ParamInfo& p : params) {
    if (!p.decay) continue;  // norms: never pruned
    for (int64_t i = p.offset; i < p.offset + p.size; ++i)
      if (data[size_t(i)] == 0.0f) {
        frozen_[size_t(i)] = 1;
        ++n;
      }
  }
  return n;
}

double AdamW::step(TrainModel& model, float* g, int64_t step, ThreadPool* pool) {
  return this->step(model.params, model.data, g, step, pool);
}

double AdamW::step(const std::vector<ParamInfo>& params, std::vector<float>& data, float* g, int64_t step,
                   ThreadPool* pool) {
  const int64_t n = int64_t(data.size());
  if (int64_t(m_.size()) != n) fail("optimizer state has ", m_.size(), " values for a model of ", n, " parameters");
  if (!frozen_.empty())
    for (int64_t i = 0; i < n; ++i)
      if (frozen_[size_t(i)]) g[i] = 0.0f;
  const double norm = global_norm(g, n);
  // torch.nn.utils.clip_grad_norm_: g *= min(1, clip / (norm + 1e-6)).
  float clip_coef = 1.0f;
  if (config_.clip > 0.0f) {
    const double c = double(config_.clip) / (norm + 1e-6);
    if (c < 1.0) clip_coef = float(c);
  }
  const float lr = float(learning_rate(config_, step));
  const double t = double(step + 1);
  const float bias1 = float(1.0 - std::pow(double(config_.beta1), t));
  const float bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(config_.beta2), t)));
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const float step_size = lr / bias1;
  for (const ParamInfo& p : params) {
    const float decay = p.decay ? 1.0f - lr * config_.weight_decay : 1.0f;
    float* w = data.data() + p.offset;
    float* gp = g + p.offset;
    float* mp = m_.data() + p.offset;
    float* vp = v_.data() + p.offset;
    auto update = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float gi = clip_coef == 1.0f ? gp[i] : gp[i] * clip_coef;
        w[i] *= decay;
        mp[i] = b1 * mp[i] + (1.0f - b1) * gi;
        vp[i] = b2 * vp[i] + (1.0f - b2) * gi * gi;
        const float denom = std::sqrt(vp[i]) / bias2_sqrt + eps;
        w[i] -= step_size * mp[i] / denom;
      }
    };
    if (pool != nullptr && p.size >= 16384) pool->parallel_for(p.size, [&](int64_t b, int64_t e, int) { update(b, e); });
    else update(0, p.size);
  }
  return norm;
}

}  // namespace tern::train
