#include "train/qat.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "quant/quant_traits.h"

namespace tern::train {
namespace {

// What the STE's clip needs of a codec: the elements that share one scale (a block, or a
// K-quant's sub-block) and how a step (the distance between neighbouring levels) follows from the
// group's quantized values. Symmetric codecs (levels -qmax .. qmax-1 or +-qmax times a scale):
// step = max |value| / qmax, since the largest weight lands on the outermost level. Codecs with a
// minimum (q4_1, q5_1, q2_k, q4_k, q5_k): the lowest and highest levels are both used, so
// step = (max - min) / (levels - 1). MXFP4's E2M1 levels are uneven (0, .5, 1, 1.5, 2, 3, 4, 6):
// its top step, 2 of 6, is the one a saturating weight is measured by (qmax 3).
struct QatClipTraits {
  DType type;
  int64_t group;
  int qmax;    // > 0: symmetric
  int levels;  // codecs with a minimum
};
constexpr QatClipTraits kClipTraits[] = {
    {DType::Q8_0, 32, 127, 0}, {DType::Q4_0, 32, 8, 0},  {DType::Q5_0, 32, 16, 0}, {DType::Q3_K, 16, 4, 0},
    {DType::Q6_K, 16, 32, 0},  {DType::MXFP4, 32, 3, 0}, {DType::Q4_1, 32, 0, 16}, {DType::Q5_1, 32, 0, 32},
    {DType::Q2_K, 16, 0, 4},   {DType::Q4_K, 32, 0, 16}, {DType::Q5_K, 32, 0, 32},
};

// How far beyond a group's extreme values (in steps) a weight still counts as rounded rather than
// saturated: rounding moves a weight by at most half a step, but the scale's f16 rounding (up to
// 127 * 2^-11 = 0.06 steps at q8_0's outer level) and K-quants' 6-bit sub-scales blur that edge.
constexpr float kClipReach = 0.625f;

const QatClipTraits* clip_traits(DType t) {
  for (const QatClipTraits& c : kClipTraits)
    if (c.type == t) return &c;
  return nullptr;
}

constexpr int64_t kTernaryBlock = 256;  // TQ1_0 / TQ2_0 blocks: one f16 scale per 256 weights

// Absmean ternarization of one block (BitNet b1.58): d = f16(mean |w|), q = clamp(round(w / d)).
// round() is the current rounding mode's (to nearest, ties to even), as torch.round.
void ternarize_block(const float* w, float* dst, uint8_t* pass) {
  double sum = 0.0;
  for (int64_t j = 0; j < kTernaryBlock; ++j) sum += std::fabs(double(w[j]));
  const float d = fp16_to_f32(f32_to_fp16(float(sum / double(kTernaryBlock))));
  for (int64_t j = 0; j < kTernaryBlock; ++j) {
    if (!(d > 0.0f)) {  // an all-zero block (or one whose mean underflows f16): zeros, no clip
      dst[j] = 0.0f;
      if (pass) pass[j] = 1;
      continue;
    }
    const float r = std::nearbyint(w[j] / d);
    dst[j] = d * std::clamp(r, -1.0f, 1.0f) + 0.0f;  // -0 would decode from the file as +0
    if (pass) pass[j] = std::fabs(w[j]) <= 1.5f * d ? 1 : 0;
  }
}

// LSQ's formats: one scale per block times integer codes in [qmin, qmax].
struct QatLsqTraits {
  DType type;
  int64_t group;
  int qmin, qmax;
  float init_divisor;  // s0 = max |w| / this (0: mean |w|, the absmean rule)
};
constexpr QatLsqTraits kLsqTraits[] = {
    {DType::Q4_0, 32, -8, 7, 8.0f},
    {DType::Q8_0, 32, -127, 127, 127.0f},
    {DType::TQ1_0, kTernaryBlock, -1, 1, 0.0f},
    {DType::TQ2_0, kTernaryBlock, -1, 1, 0.0f},
};

const QatLsqTraits* lsq_traits(DType t) {
  for (const QatLsqTraits& c : kLsqTraits)
    if (c.type == t) return &c;
  return nullptr;
}

// The scale the forward uses: f16(s), as stored; a scale the optimizer drove to 0 or below
// becomes the smallest positive f16 (so w / s stays finite).
float stored_scale(float s) {
  const float s16 = fp16_to_f32(f32_to_fp16(s));
  return s16 > 0.0f ? s16 : fp16_to_f32(uint16_t(1));
}

}  // namespace

bool qat_lsq_supported(DType t) { return lsq_traits(t) != nullptr; }

bool qat_is_ternary(DType t) { return t == DType::TQ1_0 || t == DType::TQ2_0; }

void qat_fake_quantize_row(DType t, const float* src, float* dst, uint8_t* pass, int64_t n) {
  if (qat_is_ternary(t)) {
    if (n % kTernaryBlock != 0) fail("QAT: rows of ", n, " do not fit ", dtype_name(t), "'s blocks of 256");
    for (int64_t b = 0; b < n; b += kTernaryBlock) ternarize_block(src + b, dst + b, pass ? pass + b : nullptr);
    return;
  }
  const QuantTraits* q = quant_traits(t);
  if (q == nullptr || q->from_float == nullptr) fail("QAT: tern has no quantizer for ", dtype_name(t));
  if (n % q->block_size != 0)
    fail("QAT: rows of ", n, " do not fit ", dtype_name(t), "'s blocks of ", q->block_size);
  std::vector<uint8_t> bytes(size_t(n / q->block_size * q->block_bytes));
  q->from_float(src, bytes.data(), n);
  q->to_float(bytes.data(), dst, n);
  if (pass == nullptr) return;
  const QatClipTraits* c = clip_traits(t);
  if (c == nullptr) {  // f16, bf16: nothing saturates in a weight's range
    std::fill(pass, pass + n, uint8_t(1));
    return;
  }
  for (int64_t g = 0; g < n; g += c->group) {
    const auto [lo, hi] = std::minmax_element(dst + g, dst + g + c->group);
    const float step = c->qmax > 0 ? std::max(std::fabs(*lo), std::fabs(*hi)) / float(c->qmax)
                                   : (*hi - *lo) / float(c->levels - 1);
    const float reach = kClipReach * step;
    for (int64_t j = g; j < g + c->group; ++j) pass[j] = src[j] >= *lo - reach && src[j] <= *hi + reach;
  }
}

QatModel::QatModel(const TrainModel& latent, std::vector<DType> types, ThreadPool* pool, bool lsq)
    : q_(latent), types_(std::move(types)), lsq_(lsq), pass_(size_t(latent.n_params()), 1), pool_(pool) {
  if (types_.size() != latent.params.size())
    fail("QAT: ", types_.size(), " tensor types for a model of ", latent.params.size(), " tensors");
  if (!latent.encoded.empty()) fail("QAT trains the f32 weights of a model: this one keeps matrices encoded");
  for (size_t i = 0; i < types_.size(); ++i) {
    const ParamInfo& p = latent.params[i];
    const DType t = types_[i];
    if (t == DType::F32) continue;
    if (p.ne.size() != 2) fail("QAT: ", p.name, " is not a matrix; only matrices are quantized");
    if (!qat_is_ternary(t)) {
      const QuantTraits* q = quant_traits(t);
      if (q == nullptr || q->from_float == nullptr)
        fail("QAT: tern cannot quantize to ", dtype_name(t), " (tensor ", p.name, ")");
      if (p.ne[0] % q->block_size != 0)
        fail("QAT: ", p.name, " has rows of ", p.ne[0], ", not a multiple of ", dtype_name(t), "'s block size ",
             q->block_size);
    } else if (p.ne[0] % kTernaryBlock != 0) {
      fail("QAT: ", p.name, " has rows of ", p.ne[0], ", not a multiple of ", dtype_name(t), "'s block size 256");
    }
    n_quantized_ += p.size;
  }
  if (lsq_) {
    // The scales, initialised where the codec would put them.
    scale_offset_.assign(types_.size(), -1);
    int64_t n = 0;
    for (size_t i = 0; i < types_.size(); ++i)
      if (const QatLsqTraits* c = lsq_traits(types_[i])) {
        scale_offset_[i] = n;
        n += latent.params[i].size / c->group;
      }
    if (n == 0) fail("QAT: --qat-lsq learns the scales of q4_0, q8_0 and ternary blocks; this plan has none");
    scales_.assign(size_t(n), 0.0f);
    scale_grads_.assign(size_t(n), 0.0f);
    for (size_t i = 0; i < types_.size(); ++i) {
      const QatLsqTraits* c = lsq_traits(types_[i]);
      if (c == nullptr) continue;
      const ParamInfo& p = latent.params[i];
      for (int64_t b = 0; b < p.size / c->group; ++b) {
        const float* w = latent.data.data() + p.offset + b * c->group;
        double amax = 0.0, sum = 0.0;
        for (int64_t j = 0; j < c->group; ++j) {
          amax = std::max(amax, std::fabs(double(w[j])));
          sum += std::fabs(double(w[j]));
        }
        scales_[size_t(scale_offset_[i] + b)] =
            float(c->init_divisor > 0.0f ? amax / double(c->init_divisor) : sum / double(c->group));
      }
    }
    log_scales_.resize(scales_.size());
    for (size_t k = 0; k < scales_.size(); ++k) {
      log_scales_[k] = std::log(std::max(scales_[k], 1e-30f));  // an all-zero block: a tiny scale
      scales_[k] = std::exp(log_scales_[k]);
    }
    scale_params_.push_back(ParamInfo{"qat.log_scales", {n}, 0, n, false});
    scale_opt_ = std::make_unique<AdamW>(OptimizerConfig{}, n);
  }
  update(latent);
}

void QatModel::update_lsq(size_t param, const float* w, float* dst, uint8_t* pass, int64_t n_rows) {
  const QatLsqTraits& c = *lsq_traits(types_[param]);
  const int64_t n_in = q_.params[param].ne[0];
  const float* scales = scales_.data() + scale_offset_[param];
  const int64_t blocks_per_row = n_in / c.group;
  pool_->parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < blocks_per_row; ++b) {
        const int64_t o = r * n_in + b * c.group;
        const float sc = stored_scale(scales[r * blocks_per_row + b]);
        for (int64_t j = o; j < o + c.group; ++j) {
          const float v = w[j] / sc;
          // + 0: a weight rounded to -0 is stored as code 0, which decodes to +0.
          dst[j] = sc * std::clamp(std::nearbyint(v), float(c.qmin), float(c.qmax)) + 0.0f;
          pass[j] = v >= float(c.qmin) && v <= float(c.qmax);
        }
      }
  });
}

double QatModel::step_scales(const OptimizerConfig& cfg, int64_t step) {
  OptimizerConfig c = cfg;
  c.weight_decay = 0.0f;
  scale_opt_->set_config(c);
  // AdamW moves a parameter by about lr per step whatever its gradient's size, and a scale is
  // 100 to 1000 times smaller than the weights lr is chosen for: the optimizer works on log s
  // (d/d log s = s d/ds), so that a step changes each scale by about lr relative to itself.
  const size_t n = scales_.size();
  std::vector<float> u(n), du(n);
  for (size_t i = 0; i < n; ++i) {
    u[i] = log_scales_[i];
    du[i] = scales_[i] * scale_grads_[i];
  }
  const double norm = scale_opt_->step(scale_params_, u, du.data(), step, pool_);
  for (size_t i = 0; i < n; ++i) {
    log_scales_[i] = u[i];
    scales_[i] = std::exp(u[i]);
  }
  return norm;
}

void QatModel::set_log_scales(const std::vector<float>& u) {
  if (u.size() != log_scales_.size()) fail("QAT: ", u.size(), " LSQ scales for a plan of ", log_scales_.size());
  log_scales_ = u;
  for (size_t i = 0; i < u.size(); ++i) scales_[i] = std::exp(u[i]);
}

int64_t QatModel::scale_count(size_t param) const {
  const QatLsqTraits* c = lsq_traits(types_[param]);
  return scale_offset(param) < 0 || c == nullptr ? 0 : q_.params[param].size / c->group;
}

void QatModel::encode_lsq_row(size_t param, int64_t r, uint8_t* dst) const {
  const QatLsqTraits* c = lsq_traits(types_[param]);
  if (c == nullptr || scale_offset_.empty() || scale_offset_[param] < 0)
    fail("QAT: tensor ", q_.params[param].name, " has no learned scales");
  const ParamInfo& p = q_.params[param];
  const int64_t n_in = p.ne[0], blocks_per_row = n_in / c->group;
  const float* wq = q_.data.data() + p.offset + r * n_in;
  for (int64_t b = 0; b < blocks_per_row; ++b) {
    const float sc = stored_scale(scales_[size_t(scale_offset_[param] + r * blocks_per_row + b)]);
    const float* x = wq + b * c->group;
    if (c->type == DType::Q4_0) {
      BlockQ4_0 blk;
      blk.d = f32_to_fp16(sc);
      for (int j = 0; j < 16; ++j) {
        const int lo = int(x[j] / sc) + 8, hi = int(x[j + 16] / sc) + 8;  // exact: x = sc * q
        blk.qs[j] = uint8_t(lo | (hi << 4));
      }
      std::memcpy(dst + b * int64_t(sizeof blk), &blk, sizeof blk);
    } else if (c->type == DType::Q8_0) {
      BlockQ8_0 blk;
      blk.d = f32_to_fp16(sc);
      for (int j = 0; j < 32; ++j) blk.qs[j] = int8_t(x[j] / sc);
      std::memcpy(dst + b * int64_t(sizeof blk), &blk, sizeof blk);
    } else {
      // Ternary: the absmax quantizer stores a block of 0 and +-sc as it is.
      const QuantTraits& q = require_quant_traits(c->type, p.name.c_str());
      q.from_float(x, dst + b * q.block_bytes, c->group);
    }
  }
}

void QatModel::update(const TrainModel& latent) {
  for (size_t i = 0; i < types_.size(); ++i) {
    const ParamInfo& p = latent.params[i];
    const float* src = latent.data.data() + p.offset;
    float* dst = q_.data.data() + p.offset;
    if (types_[i] == DType::F32) {
      std::copy(src, src + p.size, dst);
      continue;
    }
    const int64_t n_in = p.ne[0], n_rows = p.size / n_in;
    uint8_t* pass = pass_.data() + p.offset;
    const DType t = types_[i];
    if (lsq_ && scale_offset_[i] >= 0) {
      update_lsq(i, src, dst, pass, n_rows);
      continue;
    }
    pool_->parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) qat_fake_quantize_row(t, src + r * n_in, dst + r * n_in, pass + r * n_in, n_in);
    });
  }
  int64_t clipped = 0;
  for (uint8_t b : pass_) clipped += b == 0;
  n_clipped_ = clipped;
  latent_ = &latent;
}

void QatModel::straight_through(float* grads) {
  if (lsq_) {
    // dL/ds of every block, from dL/dW_q (before the mask): g * sum dL/dW_q * dW_q/ds.
    std::fill(scale_grads_.begin(), scale_grads_.end(), 0.0f);
    for (size_t i = 0; i < types_.size(); ++i) {
      if (scale_offset_[i] < 0) continue;
      const QatLsqTraits& c = *lsq_traits(types_[i]);
      const ParamInfo& p = q_.params[i];
      const float* w = latent_->data.data() + p.offset;
      const float* gq = grads + p.offset;
      float* gs = scale_grads_.data() + scale_offset_[i];
      const float* scales = scales_.data() + scale_offset_[i];
      const double g = 1.0 / std::sqrt(double(c.group) * double(c.qmax));
      pool_->parallel_for(p.size / c.group, [&](int64_t b0, int64_t b1, int) {
        for (int64_t b = b0; b < b1; ++b) {
          const float sc = stored_scale(scales[b]);
          double sum = 0.0;
          for (int64_t j = b * c.group; j < (b + 1) * c.group; ++j) {
            const float v = w[j] / sc;
            const float dv = v < float(c.qmin) ? float(c.qmin)
                             : v > float(c.qmax) ? float(c.qmax)
                                                 : std::nearbyint(v) - v;
            sum += double(gq[j]) * double(dv);
          }
          gs[b] = float(g * sum);
        }
      });
    }
  }
  const int64_t n = int64_t(pass_.size());
  pool_->parallel_for(n, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i)
      if (pass_[size_t(i)] == 0) grads[i] = 0.0f;
  });
}

std::string QatModel::describe() const {
  std::map<std::string, int> count;
  int n_f32 = 0;
  for (DType t : types_) {
    if (t == DType::F32) ++n_f32;
    else ++count[dtype_name(t)];
  }
  std::string s;
  for (const auto& [name, n] : count) s += str_cat(s.empty() ? "" : ", ", name, " x ", n);
  return str_cat(s.empty() ? "nothing quantized" : s, " (f32: ", n_f32, " tensors)", lsq_ ? " +lsq" : "");
}

}  // namespace tern::train
