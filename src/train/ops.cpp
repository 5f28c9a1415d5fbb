#include "train/ops.h"

#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace tern::train {
namespace {

// fn(begin, end) over [0, n) split across the pool (or on the calling thread).
template <class Fn>
void for_rows(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool == nullptr || pool->size() == 1 || n < 2) {
    if (n > 0) fn(int64_t(0), n);
    return;
  }
  pool->parallel_for(n, [&](int64_t b, int64_t e, int) { fn(b, e); });
}

}  // namespace

template <class T>
void embedding_forward(ThreadPool* pool, int64_t n, int64_t width, const int32_t* ids, const T* table, T* y) {
  for_rows(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* src = table + int64_t(ids[i]) * width;
      T* dst = y + i * width;
      for (int64_t j = 0; j < width; ++j) dst[j] = src[j];
    }
  });
}

template <class T>
void embedding_backward(ThreadPool* pool, int64_t n, int64_t width, int64_t n_vocab, const int32_t* ids,
                        const T* dy, T* d_table) {
  (void)n_vocab;
  // Split by columns: each thread adds every row's slice of its columns in row order, so two
  // rows with the same id never race and the sum order is fixed.
  for_rows(pool, width, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      T* dst = d_table + int64_t(ids[i]) * width;
      const T* src = dy + i * width;
      for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
    }
  });
}

template <class T>
void rmsnorm_forward(ThreadPool* pool, int64_t n, int64_t width, const T* x, const T* w, T eps, T* y, T* rstd) {
  for_rows(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* xi = x + i * width;
      double ss = 0.0;
      for (int64_t j = 0; j < width; ++j) ss += double(xi[j]) * double(xi[j]);
      const T r = T(1.0 / std::sqrt(ss / double(width) + double(eps)));
      rstd[i] = r;
      T* yi = y + i * width;
      for (int64_t j = 0; j < width; ++j) yi[j] = xi[j] * r * w[j];
    }
  });
}

template <class T>
void rmsnorm_backward(ThreadPool* pool, int64_t n, int64_t width, const T* x, const T* w, const T* rstd,
                      const T* dy, T* dx, T* dw, bool accumulate) {
  // y_j = x_j r w_j with r = (mean(x^2) + eps)^(-1/2):
  //   dx_j = r (w_j dy_j) - x_j r^3 / width * sum_k (w_k dy_k x_k)
  for_rows(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* xi = x + i * width;
      const T* dyi = dy + i * width;
      const T r = rstd[i];
      double dot = 0.0;
      for (int64_t j = 0; j < width; ++j) dot += double(w[j]) * double(dyi[j]) * double(xi[j]);
      const T c = T(dot * double(r) * double(r) * double(r) / double(width));
      T* dxi = dx + i * width;
      if (accumulate) {
        for (int64_t j = 0; j < width; ++j) dxi[j] += r * w[j] * dyi[j] - xi[j] * c;
      } else {
        for (int64_t j = 0; j < width; ++j) dxi[j] = r * w[j] * dyi[j] - xi[j] * c;
      }
    }
  });
  // dw by column ranges, rows in order (the same sums for any thread count), reading each
  // row's slice contiguously.
  for_rows(pool, width, [&](int64_t c0, int64_t c1) {
    std::vector<double> acc(size_t(c1 - c0), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const T* dyi = dy + i * width;
      const T* xi = x + i * width;
      const double r = double(rstd[i]);
      for (int64_t j = c0; j < c1; ++j) acc[size_t(j - c0)] += double(dyi[j]) * double(xi[j]) * r;
    }
    for (int64_t j = c0; j < c1; ++j) dw[j] += T(acc[size_t(j - c0)]);
  });
}

template <class T>
void rope_rotate(ThreadPool* pool, int64_t n, int64_t n_ctx, int64_t n_head, int64_t head_dim, float freq_base,
                 T* x, bool inverse) {
  const int64_t half = head_dim / 2;
  const int64_t n_pos = n < n_ctx ? n : n_ctx;
  // [pos][pair] cos and sin, computed in double once per call.
  std::vector<T> cs(size_t(n_pos * half * 2));
  for (int64_t p = 0; p < n_pos; ++p) {
    for (int64_t j = 0; j < half; ++j) {
      const double theta = double(p) * std::pow(double(freq_base), -2.0 * double(j) / double(head_dim));
      cs[size_t((p * half + j) * 2)] = T(std::cos(theta));
      cs[size_t((p * half + j) * 2 + 1)] = T(inverse ? -std::sin(theta) : std::sin(theta));
    }
  }
  const int64_t width = n_head * head_dim;
  for_rows(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* c = cs.data() + (i % n_ctx) * half * 2;
      T* row = x + i * width;
      for (int64_t h = 0; h < n_head; ++h) {
        T* v = row + h * head_dim;
        for (int64_t j = 0; j < half; ++j) {
          const T x0 = v[2 * j], x1 = v[2 * j + 1];
          const T co = c[2 * j], si = c[2 * j + 1];
          v[2 * j] = x0 * co - x1 * si;
          v[2 * j + 1] = x0 * si + x1 * co;
        }
      }
    }
  });
}

template <class T>
void swiglu_forward(ThreadPool* pool, int64_t count, const T* a, const T* b, T* s, T* sig) {
  for_rows(pool, count, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T g = T(1) / (T(1) + std::exp(-a[i]));
      sig[i] = g;
      s[i] = a[i] * g * b[i];
    }
  });
}

template <class T>
void swiglu_backward(ThreadPool* pool, int64_t count, const T* a, const T* b, const T* sig_a, const T* ds, T* da,
                     T* db) {
  // silu(a) = a sig(a); silu'(a) = sig(a) (1 + a (1 - sig(a)))
  for_rows(pool, count, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T sig = sig_a[i];
      const T g = ds[i];
      db[i] = g * a[i] * sig;
      da[i] = g * b[i] * sig * (T(1) + a[i] * (T(1) - sig));
    }
  });
}

template <class T>
void reglu_forward(ThreadPool* pool, int64_t count, const T* a, const T* b, T* s, T* mask) {
  for_rows(pool, count, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const bool on = a[i] > T(0);
      mask[i] = on ? T(1) : T(0);
      s[i] = on ? a[i] * b[i] : T(0);
    }
  });
}

template <class T>
void reglu_backward(ThreadPool* pool, int64_t count, const T* a, const T* b, const T* mask, const T* ds, T* da,
                    T* db) {
  for_rows(pool, count, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T g = ds[i] * mask[i];
      db[i] = g * a[i];
      da[i] = g * b[i];
    }
  });
}

template <class T>
double cross_entropy_fused(ThreadPool* pool, int64_t n, int64_t n_vocab, T* logits, const int32_t* targets,
                           T grad_scale) {
  std::vector<double> row_loss(size_t(n), 0.0);
  for_rows(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      T* l = logits + i * n_vocab;
      if (targets[i] < 0) {
        for (int64_t j = 0; j < n_vocab; ++j) l[j] = T(0);
        continue;
      }
      const T target_logit = l[targets[i]];
      T mx = l[0];
      for (int64_t j = 1; j < n_vocab; ++j) mx = l[j] > mx ? l[j] : mx;
      double sum = 0.0;
      for (int64_t j = 0; j < n_vocab; ++j) {
        const T ex = std::exp(l[j] - mx);
        l[j] = ex;
        sum += double(ex);
      }
      row_loss[size_t(i)] = std::log(sum) + double(mx) - double(target_logit);
      const T inv = T(double(grad_scale) / sum);
      for (int64_t j = 0; j < n_vocab; ++j) l[j] *= inv;
      l[targets[i]] -= grad_scale;
    }
  });
  double total = 0.0;
  for (double v : row_loss) total += v;
  return total;
}

template <class T>
double cross_entropy_loss(ThreadPool* pool, int64_t n, int64_t n_vocab, const T* logits, const int32_t* targets) {
  std::vector<double> row_loss(size_t(n), 0.0);
  for_rows(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (targets[i] < 0) continue;
      const T* l = logits + i * n_vocab;
      T mx = l[0];
      for (int64_t j = 1; j < n_vocab; ++j) mx = l[j] > mx ? l[j] : mx;
      double sum = 0.0;
      for (int64_t j = 0; j < n_vocab; ++j) sum += std::exp(double(l[j]) - double(mx));
      row_loss[size_t(i)] = std::log(sum) + double(mx) - double(l[targets[i]]);
    }
  });
  double total = 0.0;
  for (double v : row_loss) total += v;
  return total;
}

#define TERN_TRAIN_OPS(T)                                                                                        \
  template void embedding_forward<T>(ThreadPool*, int64_t, int64_t, const int32_t*, const T*, T*);               \
  template void embedding_backward<T>(ThreadPool*, int64_t, int64_t, int64_t, const int32_t*, const T*, T*);     \
  template void rmsnorm_forward<T>(ThreadPool*, int64_t, int64_t, const T*, const T*, T, T*, T*);                \
  template void rmsnorm_backward<T>(ThreadPool*, int64_t, int64_t, const T*, const T*, const T*, const T*, T*,   \
                                    T*, bool);                                                                 \
  template void rope_rotate<T>(ThreadPool*, int64_t, int64_t, int64_t, int64_t, float, T*, bool);                \
  template void swiglu_forward<T>(ThreadPool*, int64_t, const T*, const T*, T*, T*);                             \
  template void swiglu_backward<T>(ThreadPool*, int64_t, const T*, const T*, const T*, const T*, T*, T*);        \
  template void reglu_forward<T>(ThreadPool*, int64_t, const T*, const T*, T*, T*);                              \
  template void reglu_backward<T>(ThreadPool*, int64_t, const T*, const T*, const T*, const T*, T*, T*);         \
  template double cross_entropy_fused<T>(ThreadPool*, int64_t, int64_t, T*, const int32_t*, T);                  \
  template double cross_entropy_loss<T>(ThreadPool*, int64_t, int64_t, const T*, const int32_t*);
TERN_TRAIN_OPS(float)
TERN_TRAIN_OPS(double)
#undef TERN_TRAIN_OPS

}  // namespace tern::train
