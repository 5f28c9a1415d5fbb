#include "train/distill.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tern::train {

KdDivergence parse_kd_divergence(const std::string& name) {
  if (name == "fkl") return KdDivergence::Forward;
  if (name == "rkl") return KdDivergence::Reverse;
  if (name == "mix") return KdDivergence::Mix;
  if (name == "none") return KdDivergence::None;
  fail("--kd ", name, ": unknown divergence (fkl: forward KL, rkl: reverse KL, mix: both, none: hard labels only)");
}

const char* kd_divergence_name(KdDivergence d) {
  switch (d) {
    case KdDivergence::Forward: return "fkl";
    case KdDivergence::Reverse: return "rkl";
    case KdDivergence::Mix: return "mix";
    case KdDivergence::None: return "none";
  }
  return "?";
}

namespace {

// log softmax of x / temp into out (double); returns nothing.
template <class T>
void log_softmax(const T* x, int64_t n, double temp, std::vector<double>& out) {
  double mx = double(x[0]) / temp;
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, double(x[j]) / temp);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(double(x[j]) / temp - mx);
  const double lse = mx + std::log(sum);
  for (int64_t j = 0; j < n; ++j) out[size_t(j)] = double(x[j]) / temp - lse;
}

// One row: the loss, and (when grad != nullptr) its gradient times scale.
template <class T>
double kd_row(const KdConfig& c, int64_t V, const T* z, const T* zt, int32_t target, T* grad, double scale,
              std::vector<double>& ls, std::vector<double>& lt, std::vector<double>& l1) {
  const double temp = c.temperature;
  const double soft_w = c.divergence == KdDivergence::None ? 0.0 : 1.0 - c.hard_weight;
  const double hard_w = c.divergence == KdDivergence::None ? 1.0 : c.hard_weight;
  double loss = 0.0;
  if (grad != nullptr)
    for (int64_t j = 0; j < V; ++j) grad[j] = T(0);
  if (hard_w > 0.0 && target >= 0) {
    log_softmax(z, V, 1.0, l1);
    loss += hard_w * -l1[size_t(target)];
    if (grad != nullptr) {
      for (int64_t j = 0; j < V; ++j) grad[j] = T(scale * hard_w * std::exp(l1[size_t(j)]));
      grad[target] -= T(scale * hard_w);
    }
  }
  if (soft_w > 0.0) {
    log_softmax(z, V, temp, ls);
    log_softmax(zt, V, temp, lt);
    const double wf = c.divergence == KdDivergence::Forward ? 1.0 : c.divergence == KdDivergence::Mix ? c.mix : 0.0;
    const double wr = 1.0 - wf;
    double fkl = 0.0, rkl = 0.0;
    for (int64_t j = 0; j < V; ++j) {
      const double pt = std::exp(lt[size_t(j)]), ps = std::exp(ls[size_t(j)]);
      if (wf > 0.0 && pt > 0.0) fkl += pt * (lt[size_t(j)] - ls[size_t(j)]);
      if (wr > 0.0 && ps > 0.0) rkl += ps * (ls[size_t(j)] - lt[size_t(j)]);
    }
    const double t2 = temp * temp;
    loss += soft_w * t2 * (wf * fkl + wr * rkl);
    if (grad != nullptr) {
      // d(T^2 D)/dz = T * dD/d(z/T)
      for (int64_t j = 0; j < V; ++j) {
        const double pt = std::exp(lt[size_t(j)]), ps = std::exp(ls[size_t(j)]);
        double d = 0.0;
        if (wf > 0.0) d += wf * (ps - pt);
        if (wr > 0.0) d += wr * ps * (ls[size_t(j)] - lt[size_t(j)] - rkl);
        grad[j] += T(scale * soft_w * temp * d);
      }
    }
  }
  return loss;
}

template <class T>
double kd_rows(ThreadPool* pool, const KdConfig& c, int64_t n, int64_t V, const T* z, T* grad_out, const T* zt,
               const int32_t* targets, double scale) {
  if (!(c.temperature > 0.0)) fail("--temperature must be positive");
  if (c.hard_weight < 0.0 || c.hard_weight > 1.0) fail("--hard-weight must be in [0, 1]");
  if (c.mix < 0.0 || c.mix > 1.0) fail("--kd-mix must be in [0, 1]");
  std::vector<double> row_loss(size_t(n), 0.0);
  auto work = [&](int64_t b, int64_t e) {
    const size_t nv = static_cast<size_t>(V);
    std::vector<double> ls(nv), lt(nv), l1(nv);
    for (int64_t i = b; i < e; ++i) {
      // In place: z and grad may be the same row, so the row is copied first.
      std::vector<T> zrow(z + i * V, z + (i + 1) * V);
      row_loss[size_t(i)] = kd_row<T>(c, V, zrow.data(), zt + i * V, targets[i],
                                      grad_out != nullptr ? grad_out + i * V : nullptr, scale, ls, lt, l1);
    }
  };
  if (pool == nullptr || n < 2) work(0, n);
  else pool->parallel_for(n, [&](int64_t b, int64_t e, int) { work(b, e); });
  double total = 0.0;
  for (double v : row_loss) total += v;
  return total;
}

}  // namespace

template <class T>
double kd_loss_fused(ThreadPool* pool, const KdConfig& c, int64_t n, int64_t n_vocab, T* student, const T* teacher,
                     const int32_t* targets, T grad_scale) {
  return kd_rows<T>(pool, c, n, n_vocab, student, student, teacher, targets, double(grad_scale));
}

template <class T>
double kd_loss(ThreadPool* pool, const KdConfig& c, int64_t n, int64_t n_vocab, const T* student, const T* teacher,
               const int32_t* targets) {
  return kd_rows<T>(pool, c, n, n_vocab, student, static_cast<T*>(nullptr), teacher, targets, 1.0);
}

template double kd_loss_fused<float>(ThreadPool*, const KdConfig&, int64_t, int64_t, float*, const float*,
                                     const int32_t*, float);
template double kd_loss_fused<double>(ThreadPool*, const KdConfig&, int64_t, int64_t, double*, const double*,
                                      const int32_t*, double);
template double kd_loss<float>(ThreadPool*, const KdConfig&, int64_t, int64_t, const float*, const float*,
                               const int32_t*);
template double kd_loss<double>(ThreadPool*, const KdConfig&, int64_t, int64_t, const double*, const double*,
                                const int32_t*);

}  // namespace tern::train
